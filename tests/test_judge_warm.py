"""The judge's warm-up compiles the fused check for both of Triton's size specialisations."""

from evaluators.judge.prewarm import WARM_SIZES, warm_checks


def test_the_warm_up_checks_sizes_divisible_by_16_and_not_for_every_dtype():
    kinds = (("float32", "tol32"), ("bfloat16", "tol16"))
    checks = warm_checks(*kinds)
    for dt, tol in kinds:
        sizes = {n for n, d, t in checks if (d, t) == (dt, tol)}
        assert any(n % 16 == 0 for n in sizes) and any(n % 16 for n in sizes), sizes
        assert all(n > 1 for n in sizes)   # a count of 1 is a third specialisation, not one the checks see
    assert len(checks) == len(kinds) * len(WARM_SIZES)
