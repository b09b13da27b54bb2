"""evaluators: the cascade policy -> compile -> correctness -> timing -> profile.

Re-exports of the stages' public names; one import line per module, so additions merge cleanly.
"""

from evaluators.compile import CompileOutcome, CompileStage, CutlassNotFound, NvccNotFound, compile_candidate, compile_to_file, cutlass_include_dir, cutlass_version, find_nvcc, nvcc_version, parse_ptxas
from evaluators.policy import POLICY_RULES, PolicyStage, Rule, Violation, check_candidate, check_policy
