"""Compile errors for repair prompts: the candidate's own lines first, header line numbers
never taken for kernel lines. The CuTe log is real nvcc 13.0 output (this CPU machine,
2026-12-03) for tests/fixtures/llm/matvec_mismatched_ranks.cu (a make_stride with one mode
too many)."""

from __future__ import annotations

from pathlib import Path

from mutators.llm.prompt.diagnostics import digest, kernel_lines, numbered_excerpt, parse_diagnostics

FIX = Path(__file__).parent / "fixtures" / "llm"
LOG = (FIX / "nvcc_cute_mismatched_ranks.log").read_text()
CUT = (FIX / "nvcc_cute_mismatched_ranks.errors").read_text()
SRC = (FIX / "matvec_mismatched_ranks.cu").read_text()


def test_the_real_cute_log_is_read_with_its_instantiation_chains():
    d1, d2 = parse_diagnostics(LOG)
    assert (d1.file, d1.line, d1.severity) == ("<cutlass>/cute/stride.hpp", 109, "error")
    assert d1.message == 'static assertion failed with "Mismatched Ranks"'
    assert [(f.file, f.line) for f in d1.frames] == [("<cutlass>/cute/layout.hpp", 171),
                                                      ("<cutlass>/cute/tensor_impl.hpp", 241),
                                                      ("<cutlass>/cute/tensor_impl.hpp", 266),
                                                      ("candidate.cu", 88), ("candidate.cu", 163)]
    assert d2.frames[0] == d2.frames[0].__class__(d2.frames[0].what, "<cutlass>/cute/stride.hpp", 110), \
        "'at line 110' without a file is the diagnostic's own file"


def test_only_the_kernels_own_lines_are_marked():
    assert kernel_lines(LOG, SRC) == [88, 163]
    assert kernel_lines(CUT, SRC) == [88, 163], "the cut errors excerpt still has the first chain's frames"
    # before: the 'line (\\d+)' fallback marked 171, 241, 266, 88, 163 and 110 (header line numbers)
    header_only = 'x.hpp(5): error: y\n  detected during instantiation of "f" at line 502 of /i/cute/layout.hpp\n'
    assert kernel_lines(header_only, SRC) == []
    assert kernel_lines("forbidden call popen at line 20 (rule no-process)", SRC) == [20]
    assert kernel_lines("see line 7 of other.h", SRC) == []


def test_candidate_errors_come_before_header_errors():
    log = ("<cutlass>/cute/layout.hpp(10): error: no instance of overloaded function\n"
           "          detected during instantiation of \"g\" at line 61 of candidate.cu\n\n"
           "candidate.cu(51): error: identifier \"ROWZ\" is undefined\n"
           "    const int64_t row0 = int64_t(blockIdx.x) * ROWZ;\n\n")
    text = digest(log, SRC)
    assert text.startswith("2 errors; in your kernel at lines 51, 61.")
    assert text.index("candidate.cu(51): error: identifier \"ROWZ\"") < text.index("no instance of overloaded")
    assert kernel_lines(log, SRC) == [51, 61]


def test_repeated_messages_are_merged_and_the_digest_is_bounded():
    one = ('<cutlass>/cute/a.hpp(3): error: bad\n          detected during instantiation of "f" at line 88 of '
           'candidate.cu\n\n')
    text = digest(one * 40, SRC)
    assert text.count("error: bad") == 1 and "(39 more messages repeating the ones above omitted)" in text
    assert len(digest(LOG, SRC, max_chars=500)) <= 500


def test_host_compiler_errors_and_plain_texts():
    gcc = "candidate.cu:12:5: error: expected ';' before '}' token\n"
    assert kernel_lines(gcc, SRC) == [12] and "candidate.cu(12): error: expected ';'" in digest(gcc, SRC)
    assert digest("max abs error 3.2 at [17, 4]", SRC) == "max abs error 3.2 at [17, 4]"


def test_a_log_that_names_the_candidate_differently():
    log = 'kernel.cu(16): error: identifier "BLOK" is undefined\n'
    assert kernel_lines(log, SRC) == [16]


def test_numbered_excerpt_marks_and_merges():
    out = numbered_excerpt(SRC, [88, 89], context=1)
    assert out.splitlines()[0].startswith("     87 |") and out.count(">>") == 2 and "..." not in out
