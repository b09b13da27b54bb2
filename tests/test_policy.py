"""Static policy check: one violating fixture per rule, evasions, and no false positives.

Fixtures live in tests/fixtures/policy/<rule>[--variant].cu. Each names its rule and the
exploit it tries in a header comment, marks the expected first violation with
``// <-- VIOLATION`` (or ``// expect-line: N`` in the header), and may give tunable values
with ``// params: NAME=VALUE``.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evaluators.policy import (
    MAX_SOURCE_BYTES,
    MAX_SOURCE_LINES,
    POLICY_RULES,
    PolicyStage,
    Rule,
    check_policy,
    include_allowed,
    param_violations,
)
from evo.core.records import Candidate, Status

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "policy"
KERNELS = ROOT / "evo" / "tasks" / "kernels"
TINY = ROOT / "tests" / "fixtures" / "compile" / "tiny_cute.cu"

FIXTURE_FILES = sorted(FIXTURES.glob("*.cu"))

# A minimal compliant candidate to splice test snippets into.
BASE = """\
#include <cute/tensor.hpp>
#include "evo_abi.h"

__global__ void relu(const float* x, float* y, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
@@TOP@@
EVO_EXPORT int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out,
                          const double* scalars, int n_scalars, cudaStream_t stream) {
  int64_t n = evo_numel(in[0]);
@@BODY@@
  relu<<<(n + 255) / 256, 256, 0, stream>>>(static_cast<const float*>(in[0].data),
                                            static_cast<float*>(out[0].data), n);
  return static_cast<int>(cudaGetLastError());
}
"""


def kernel(top: str = "", body: str = "") -> str:
    return BASE.replace("@@TOP@@", top).replace("@@BODY@@", body)


def rules_of(result) -> set[str]:
    return {v["rule"] for v in result.metrics["violations"]}


def _expected(path: Path) -> tuple[str, int, dict[str, str] | None]:
    text = path.read_text()
    rule = path.stem.split("--")[0]
    m = re.search(r"^// expect-line: (\d+)$", text, re.M)
    if m:
        line = int(m.group(1))
    else:
        marks = [i for i, ln in enumerate(text.splitlines(), 1) if "<-- VIOLATION" in ln]
        assert len(marks) == 1, f"{path.name} must mark exactly one line with <-- VIOLATION"
        line = marks[0]
    pm = re.search(r"^// params: (\w+)=(.*)$", text, re.M)
    params = {pm.group(1): pm.group(2)} if pm else None
    return rule, line, params


# ---------------------------------------------------------------------------------------------
# Rules and fixtures


def test_rules_are_named_frozen_and_picklable():
    names = [r.name for r in POLICY_RULES]
    assert len(names) == len(set(names))
    for r in POLICY_RULES:
        assert isinstance(r, Rule) and r.reason and re.fullmatch(r"[a-z][a-z-]+", r.name)
        with pytest.raises(AttributeError):
            r.name = "x"  # type: ignore[misc]
    again = pickle.loads(pickle.dumps(POLICY_RULES))
    assert [r.name for r in again] == names


def test_every_rule_has_a_fixture():
    covered = {p.stem.split("--")[0] for p in FIXTURE_FILES}
    assert covered == {r.name for r in POLICY_RULES}


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: p.stem)
def test_fixture_is_rejected_by_exactly_its_rule(path: Path):
    rule, line, params = _expected(path)
    text = path.read_text()
    assert f"rule: {rule}" in text.splitlines()[0], "the header comment must name the rule"
    assert "Exploit tried:" in text
    res = check_policy(text, params)
    assert res.stage == "policy"
    assert res.status is Status.REJECTED
    assert rules_of(res) == {rule}, res.artifacts["violations"]
    first = res.metrics["violations"][0]
    assert first["rule"] == rule and first["line"] == line, res.metrics["violations"]
    assert f"{rule} violated at line {line}" in res.reason
    assert f"line {line}: [{rule}]" in res.artifacts["violations"]


def test_fixture_becomes_clean_without_its_params():
    text = (FIXTURES / "param-syntax.cu").read_text()
    assert check_policy(text).passed
    assert check_policy(text, {"BLOCK": "128"}).passed


# ---------------------------------------------------------------------------------------------
# Real kernels pass


def _complete_kernels() -> list[Path]:
    return [p for p in sorted(KERNELS.glob("*.cu")) if re.search(r"\bevo_launch\s*\(", p.read_text())]


@pytest.mark.parametrize("path", _complete_kernels(), ids=lambda p: p.name)
def test_shipped_kernel_files_pass(path: Path):
    res = check_policy(path.read_text())
    assert res.passed, res.artifacts.get("violations")


def test_seed_kernels_pass():
    seeds = pytest.importorskip("evo.tasks.seeds")
    names = list(seeds.seed_names())
    assert names
    for name in names:
        res = check_policy(seeds.seed_source(name), seeds.seed_params(name) if hasattr(seeds, "seed_params") else None)
        assert res.passed, f"{name}: {res.artifacts.get('violations')}"


def test_tiny_compile_fixture_and_base_pass():
    assert check_policy(TINY.read_text()).passed
    res = check_policy(kernel())
    assert res.passed and res.metrics["n_violations"] == 0 and res.seconds < 3.0


# ---------------------------------------------------------------------------------------------
# No false positives: names in comments, strings, members, device idioms

LEGIT_TOP = r'''
// system("rm -rf /"); fopen getenv socket pthread_create std::thread cublasSgemm
/* multi-line comment: popen("x")
   cudaDeviceSynchronize(); static int cache = 0; */
static constexpr int kTile = 128;
static const int kStages = 4;
constexpr float kScale = 1.5f;
const float* const kNoTable = nullptr;
__constant__ float c_coeffs[8];
extern __shared__ char smem_dynamic[];
CUTE_INLINE_CONSTANT int kInlineConst = 3;
namespace detail { constexpr int kDepth = 2; }
using namespace cute;
typedef float real_t;
template <int N> struct Tag { static constexpr int value = N; };
struct alignas(16) Pair { float a, b; };
enum class Mode : int { kFast = 0, kSlow = 1 };
#define DEVFN __device__ __forceinline__
DEVFN unsigned lane_id() { unsigned r; asm volatile("mov.u32 %0, %%laneid;" : "=r"(r)); return r; }
CUTE_DEVICE void fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
CUTE_HOST_DEVICE int twice(int x) { return 2 * x; }
__device__ void wait_a_bit() { __nanosleep(100); long long t = clock64(); (void)t; }
struct Pipe { __device__ void send(int) {} __device__ void open() {} };
__device__ void member_calls(Pipe& p) { p.send(1); p.open(); }
__global__ void shared_kernel(float* y) {
  static __shared__ float tile[32];
  __shared__ float other[32];
  tile[threadIdx.x] = other[threadIdx.x] = 0.f;
  y[threadIdx.x] = tile[threadIdx.x] + kTile + kStages + c_coeffs[0];
}
'''

LEGIT_BODY = r'''
  const char* msg = "system(\"x\") getenv fopen cudaMalloc <<<1, 2>>>";
  const char* raw = R"delim(popen("ls") */ // cudaStreamCreate)delim";
  char quote = '"';
  int big = 1'000'000; char c2 = 'x';
  (void)msg; (void)raw; (void)quote; (void)big; (void)c2;
  cudaMemsetAsync(out[0].data, 0, 16, stream);
  cudaMemcpyAsync(out[0].data, in[0].data, 16, cudaMemcpyDeviceToDevice, stream);
  cudaFuncSetAttribute(relu, cudaFuncAttributeMaxDynamicSharedMemorySize, 0);
  int sms = 0; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  auto t = cute::make_tuple(1, 2); auto r = cute::remove<0>(t); (void)r;
  void* enc = nullptr; cudaDriverEntryPointQueryResult q;
  cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &enc, cudaEnableDefault, &q);
  if (n > 0) { int local = 0; local++; }
  for (int i = 0; i < 2; ++i) { shared_kernel<<<1, 32, 0, stream>>>(static_cast<float*>(out[0].data)); }
'''


def test_no_false_positives_on_legit_idioms():
    res = check_policy(kernel(LEGIT_TOP, LEGIT_BODY))
    assert res.passed, res.artifacts.get("violations")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\n\r\\"), max_size=80))
def test_anything_inside_a_line_comment_is_ignored(junk: str):
    assert check_policy(kernel("// " + junk + "\n", "  // " + junk + "\n")).passed


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.characters(exclude_categories=("Cs",), exclude_characters='\n\r\\"'), max_size=80))
def test_anything_inside_a_string_literal_is_ignored(junk: str):
    body = f'  const char* s = "{junk}"; (void)s;\n'
    assert check_policy(kernel("", body)).passed


# ---------------------------------------------------------------------------------------------
# Evasions are caught

EVASIONS = [
    ("splice", "", '  sys\\\ntem("id");\n', "no-host-process"),
    ("macro-alias", "#define RUN system\n", '  RUN("id");\n', "no-host-process"),
    ("std-qualified", "", '  const char* e = std::getenv("X"); (void)e;\n', "no-env"),
    ("global-qualified", "", '  ::system("id");\n', "no-host-process"),
    ("function-pointer", "", '  auto fp = &popen; (void)fp;\n', "no-host-process"),
    ("digraph-include", "%:include <cstdlib>\n", "", "include-allowlist"),
    ("computed-include", '#define HDR "x.h"\n#include HDR\n', "", "include-allowlist"),
    ("traversal-include", '#include "cute/../../../../etc/passwd"\n', "", "include-allowlist"),
    ("cstdio", "#include <cstdio>\n", "", "include-allowlist"),
    ("iostream", "#include <iostream>\n", "", "include-allowlist"),
    ("embed", '#embed "/etc/passwd"\n', "", "include-allowlist"),
    ("driver-lookup", "", '  void* f; cudaDriverEntryPointQueryResult q;\n'
     '  cudaGetDriverEntryPoint("cuCtxSynchronize", &f, cudaEnableDefault, &q);\n', "no-host-process"),
    ("dlsym", "", '  void* f = dlsym(nullptr, "cublasSgemm_v2"); (void)f;\n', "no-host-process"),
    ("exit", "", "  if (n == 7) exit(0);\n", "no-host-process"),
    ("macro-static", "#define CACHE static int hits = 0;\n", "  CACHE\n", "no-global-state"),
    ("thread-local", "thread_local int t_calls = 0;\n", "", "no-global-state"),
    ("managed", "__managed__ int m_calls;\n", "", "no-global-state"),
    ("static-member", "struct Memo { static int calls; };\n", "", "no-global-state"),
    ("pointer-to-const", "const float* g_prev = nullptr;\n", "", "no-global-state"),
    ("ctor-syntax", "int g_count(0);\n", "", "no-global-state"),
    ("struct-var", "struct { const void* p; } g_memo;\n", "", "no-global-state"),
    ("stream-zero", "", "  relu<<<1, 1, 0, 0>>>(nullptr, nullptr, 0);\n", "no-side-stream-or-sync"),
    ("per-thread", "", "  relu<<<1, 1, 0, cudaStreamPerThread>>>(nullptr, nullptr, 0);\n", "no-side-stream-or-sync"),
    ("macro-launch", "#define GO(k) k<<<1, 1>>>\n", "", "no-side-stream-or-sync"),
    ("device-sync", "", "  cudaDeviceSynchronize();\n", "no-side-stream-or-sync"),
    ("sync-memcpy", "", "  cudaMemcpy(out[0].data, in[0].data, 4, cudaMemcpyDefault);\n", "no-side-stream-or-sync"),
    ("events", "", "  cudaEvent_t e; cudaEventCreate(&e);\n", "no-side-stream-or-sync"),
    ("graphs", "", "  cudaGraph_t g; (void)g;\n", "no-side-stream-or-sync"),
    ("host-func", "", "  cudaLaunchHostFunc(stream, nullptr, nullptr);\n", "no-side-stream-or-sync"),
    ("malloc-async", "", "  void* w; cudaMallocAsync(&w, 64, stream);\n", "no-side-stream-or-sync"),
    ("torch", "", "  auto t = at::empty({1});\n", "no-library-fallback"),
    ("cudnn", "", "  cudnnHandle_t h;\n", "no-library-fallback"),
    ("chrono", "", "  auto t0 = std::chrono::steady_clock::now();\n", "no-host-time"),
    ("sleep", "", "  usleep(10);\n", "no-host-time"),
    ("time", "", "  long t = time(nullptr); (void)t;\n", "no-host-time"),
    ("std-thread", "", "  std::thread th([] {});\n", "no-threads"),
    ("std-async", "", "  auto f = std::async([] { return 1; });\n", "no-threads"),
    ("environ", "", "  char** e = environ; (void)e;\n", "no-env"),
    ("file-scope-asm", 'asm(".globl evil");\n', "", "no-host-asm"),
    ("fstream", "", '  std::ofstream f("x");\n', "no-host-file-io"),
    ("remove-file", "", '  remove("/tmp/x");\n', "no-host-file-io"),
    ("connect", "", "  connect(3, nullptr, 0);\n", "no-network"),
    ("undef-entry", "#define evo_launch other_name\n", "", "one-entry-point"),
    # std::system and other library calls by any spelling
    ("ns-alias", "namespace q = std;\n", '  q::system("id");\n', "no-host-process"),
    ("ns-alias-chain", "namespace q = std;\nnamespace r = q;\n", "  r::exit(0);\n", "no-host-process"),
    ("ns-using", "namespace q { using ::exit; }\n", "  q::exit(0);\n", "no-host-process"),
    ("macro-qualifier", "#define Q std\n", "  Q::exit(0);\n", "no-host-process"),
    ("inline-ns", "", '  std::__1::system("id");\n', "no-host-process"),
    ("using-decl", "using std::system;\n", '  system("id");\n', "no-host-process"),
    ("paren-name", "", '  (system)("id");\n', "no-host-process"),
    ("paren-call", "", "  (exit)(0);\n", "no-host-process"),
    ("exit-pointer", "", "  auto f = ::exit; f(0);\n", "no-host-process"),
    ("exit-address", "", "  void (*f)(int) = &exit; f(0);\n", "no-host-process"),
    ("std-thread-alias", "namespace q = std;\n", "  q::thread th([] {});\n", "no-threads"),
    ("using-ns-thread", "using namespace std;\n", "  thread th([] {});\n", "no-threads"),
    ("nr-number", "", "  long nr = __NR_execve; (void)nr;\n", "no-host-process"),
    ("wordexp", "", "  wordexp(\"$(id)\", nullptr, 0);\n", "no-host-process"),
    # symbols bound to other names
    ("asm-label", 'extern "C" int run(const char*) __asm__("system");\n', '  run("id");\n', "no-linker-tricks"),
    ("asm-label-object-macro", '#define AS __asm__\nextern "C" int run(const char*) AS("system");\n', "",
     "no-linker-tricks"),
    ("asm-label-in-device-fn", '__device__ void d() { extern int run(const char*) asm("system"); }\n', "",
     "no-linker-tricks"),
    ("weakref", 'static int run(const char*) __attribute__((weakref("system")));\n', "", "no-linker-tricks"),
    ("alias", 'extern "C" int run(const char*) __attribute__((__alias__("system")));\n', "", "no-linker-tricks"),
    ("attr-macro-word", '#define W weakref\nstatic int run(const char*) __attribute__((W("system")));\n', "",
     "no-linker-tricks"),
    ("ifunc", 'extern "C" int run(const char*) __attribute__((ifunc("pick")));\n', "", "no-linker-tricks"),
    ("pragma-weak", "#pragma weak run = system\n", "", "no-linker-tricks"),
    ("pragma-computed", "#define P(x) _Pragma(#x)\nP(redefine_extname run system)\n", "", "no-linker-tricks"),
    ("pragma-string", '_Pragma("redefine_extname run system")\n', "", "no-linker-tricks"),
    # the Python interpreter the harness runs in
    ("python-include", "#include <Python.h>\n", "", "no-python-api"),
    ("python-private", 'extern "C" int _PyRun_SimpleStringFlagsWithName(const char*, void*);\n', "",
     "no-python-api"),
    ("python-in-macro", "#define RUN PyRun_SimpleString\n", '  RUN("1");\n', "no-python-api"),
    # host asm through __host__ __device__ functions and macros
    ("hd-asm", '__host__ __device__ int hd() { int r; asm("mov.u32 %0, 1;" : "=r"(r)); return r; }\n', "",
     "no-host-asm"),
    ("hd-asm-cute-macro", 'CUTE_HOST_DEVICE int hd() { int r; asm("mov.u32 %0, 1;" : "=r"(r)); return r; }\n', "",
     "no-host-asm"),
    ("hd-asm-ifndef", '__host__ __device__ int hd() {\n#ifndef __CUDA_ARCH__\n  asm("nop");\n#endif\n  return 0; }\n',
     "", "no-host-asm"),
    ("hd-asm-else", '__host__ __device__ int hd() {\n#ifdef __CUDA_ARCH__\n  return 1;\n#else\n  asm("nop");\n'
     "#endif\n  return 0; }\n", "", "no-host-asm"),
    ("hd-macro", "#define HD __host__ __device__\nHD int hd() { asm(\"nop\"); return 0; }\n", "", "no-host-asm"),
    ("asm-macro-in-host", '#define NOP asm volatile("nop")\n', "  NOP;\n", "no-host-asm"),
    ("syscall-asm-in-device", '__device__ void d() { asm volatile("sys" "call"); }\n', "", "no-host-asm"),
    ("raw-string-ifdef", 'const char* const kDoc = R"(\n#ifdef __CUDA_ARCH__\n)";\n'
     '__host__ __device__ int hd() { asm("nop"); return 0; }\n', "", "no-host-asm"),
    ("digraph-scope", '__device__ void d() <% %>\nstatic int h() { asm("nop"); return 0; }\n', "", "no-host-asm"),
    # the reader reads what the compiler reads
    ("formfeed-include", "\f#include <cstdio>\n", "", "include-allowlist"),
    ("vtab-paste", "\v#define G(a, b) a##b\n", "", "no-token-pasting"),
    ("bom-mid-line", "\ufeff#include <cstdlib>\n", "", "include-allowlist"),
    ("nul-before-directive", "\0#define G(a, b) a##b\n", "", "no-token-pasting"),
    ("lone-cr-comment", "", '  // note\r  system("id");\n', "no-host-process"),
    ("lone-cr-directive", "// note\r#include <cstdlib>\n", "", "include-allowlist"),
    ("crlf-splice", "", '  sys\\\r\ntem("id");\n', "no-host-process"),
    ("dollar-raw", "#define $R\n", '  const char* s = $R"(";  system("id"); // )";\n', "no-host-process"),
    ("comment-then-directive", "/* a\n */ #include <cstdlib>\n", "", "include-allowlist"),
    ("raw-in-directive", '#define Q R"(\n  system("id");\n#define E )"\n', "", "no-host-process"),
    ("redefine-const", "#define const\nconst int* const g = nullptr;\n", "", "no-redefined-keywords"),
    ("redefine-cuda-arch", "#define __CUDA_ARCH__ 900\n", "", "no-redefined-keywords"),
    ("undef-cute-device", "#undef CUTE_DEVICE\n#define CUTE_DEVICE\n", "", "no-redefined-keywords"),
    ("undef-cudacc", "#undef __CUDACC__\n", "", "no-redefined-keywords"),
    ("unterminated-raw", "", '  const char* s = R"x(never closed;\n', "plain-source"),
]


@pytest.mark.parametrize("name,top,body,rule", EVASIONS, ids=[e[0] for e in EVASIONS])
def test_evasion_is_caught(name: str, top: str, body: str, rule: str):
    res = check_policy(kernel(top, body))
    assert res.status is Status.REJECTED
    assert rule in rules_of(res), res.artifacts.get("violations")


DEVICE_ONLY_ASM = r'''
__host__ __device__ int hd_a() {
#ifdef __CUDA_ARCH__
  int r; asm("mov.u32 %0, 1;" : "=r"(r)); return r;
#else
  return 1;
#endif
}
CUTE_HOST_DEVICE int hd_b() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async;" ::: "memory");
#elif __CUDA_ARCH__ >= 800
  asm volatile("membar.gl;" ::: "memory");
#endif
  return 0;
}
__host__ __device__ int hd_c() {
#ifndef __CUDA_ARCH__
  return 0;
#else
  unsigned r; asm("mov.u32 %0, %%laneid;" : "=r"(r)); return int(r);
#endif
}
__device__ void branchy(int lane) {
  if (lane == 0) asm volatile("bar.sync 1, 64;" ::: "memory");
  if constexpr (sizeof(int) == 4) asm volatile("membar.cta;" ::: "memory");
  else asm volatile("membar.gl;" ::: "memory");
  for (int i = 0; i < 2; ++i) asm volatile("nop;");
}
#define FENCE() asm volatile("fence.proxy.async.shared::cta;" ::: "memory")
__device__ void fenced() { FENCE(); }
#pragma once
#pragma nv_diag_suppress 177
__device__ void unrolled(float* y) {
#pragma unroll 4
  for (int i = 0; i < 4; ++i) y[i] = 0.f;
  _Pragma("unroll")
  for (int i = 0; i < 4; ++i) y[i] += 1.f;
}
[[maybe_unused]] static constexpr int kUnused = 0;
__attribute__((unused)) static constexpr int kAlsoUnused = 0;
__global__ void __launch_bounds__(256) bounded(float* y) { int alias = 0; y[alias] = 0.f; }
__device__ float no_alias_load(const float* __restrict__ p) { return __ldg(p); }
namespace cg = cooperative_groups;
'''


def test_device_only_asm_pragmas_and_attributes_pass():
    res = check_policy(kernel("#define __CUDA_NO_HALF_OPERATORS__\n" + DEVICE_ONLY_ASM,
                              '  const char* cost = "$5"; (void)cost;\n'))
    assert res.passed, res.artifacts.get("violations")


@pytest.mark.parametrize("path", _complete_kernels()[:3], ids=lambda p: p.name)
def test_crlf_bom_and_form_feed_spellings_of_a_kernel_pass(path: Path):
    """What the compiler reads as the same source reads the same to the policy."""
    text = path.read_text()
    assert check_policy("\ufeff" + text.replace("\n", "\r\n")).passed
    assert check_policy(text.replace("\n\n", "\n\f\n").replace("//", "\v//")).passed


def test_lone_cr_counts_as_a_line_end():
    src = kernel("", '  int a = 0; // x\r  getenv("X");\n')
    want = next(i for i, ln in enumerate(src.replace("\r", "\n").split("\n"), 1) if "getenv" in ln)
    res = check_policy(src)
    assert res.metrics["violations"][0]["line"] == want
    assert 'getenv("X")' in res.artifacts["violations"]


def test_tunable_values_that_change_how_code_reads_are_refused():
    for value in ("asm", "__asm__", "static", "_Pragma", "weakref", "PyRun_SimpleString"):
        assert [v.rule for v in param_violations({"OP": value})] == ["param-syntax"], value
    for name in ("const", "static", "CUTE_DEVICE", "_Reserved", "EVO_EXPORT"):
        assert param_violations({name: "1"}), name
    assert param_violations({"EVO_DTYPE": "float", "OP": "cute::multiplies"}) == []


def test_std_remove_algorithm_is_not_file_io():
    body = "  int a[3] = {1, 2, 3}; auto e = std::remove(a, a + 3, 2); (void)e;\n"
    assert check_policy(kernel("", body)).passed


def test_line_numbers_survive_splices_and_comments():
    top = "/* a\n b\n c */\n#define LONG_MACRO(x) \\\n  (x) + \\\n  (x)\n"
    src = kernel(top, '  getenv("X");\n')
    want = next(i for i, ln in enumerate(src.splitlines(), 1) if "getenv" in ln)
    res = check_policy(src)
    assert res.metrics["violations"][0]["line"] == want


def test_all_violations_listed_and_counted():
    src = kernel("static int a = 0;\n", '  system("x");\n  getenv("Y");\n')
    res = check_policy(src)
    assert rules_of(res) == {"no-global-state", "no-host-process", "no-env"}
    assert res.metrics["n_violations"] == 3
    assert "(+2 more violations)" in res.reason
    assert res.reason.startswith("policy rule no-global-state violated at line ")


# ---------------------------------------------------------------------------------------------
# Entry point, size, params


def test_missing_entry_point():
    src = "#include \"evo_abi.h\"\n__global__ void k() {}\n"
    res = check_policy(src)
    assert rules_of(res) == {"one-entry-point"}
    assert res.metrics["violations"][0]["line"] == 1


def test_entry_point_spellings_accepted():
    alt = BASE.replace(
        "EVO_EXPORT int evo_launch(const EvoTensor* in, int n_in, EvoTensor* out, int n_out,\n"
        "                          const double* scalars, int n_scalars, cudaStream_t stream)",
        'extern "C" int evo_launch(EvoTensor const* __restrict__ in, const int n_in, EvoTensor* out, int,\n'
        "                          const double* const scalars, int n_scalars, cudaStream_t stream)",
    )
    assert alt != BASE
    res = check_policy(alt.replace("@@TOP@@", "").replace("@@BODY@@", ""))
    assert res.passed, res.artifacts.get("violations")


def test_entry_point_must_return_int_and_not_be_static():
    bad = BASE.replace("EVO_EXPORT int evo_launch", "static int evo_launch")
    res = check_policy(bad.replace("@@TOP@@", "").replace("@@BODY@@", ""))
    assert rules_of(res) == {"one-entry-point"}


def test_size_limit_in_bytes():
    pad = "// " + "x" * (MAX_SOURCE_BYTES + 10) + "\n"
    res = check_policy(kernel(pad))
    assert rules_of(res) == {"size-limit"}


def test_size_limit_lines_boundary():
    base = kernel()
    n = base.count("\n")
    ok = base + "//\n" * (MAX_SOURCE_LINES - n)
    assert check_policy(ok).passed
    res = check_policy(ok + "//\n")
    assert rules_of(res) == {"size-limit"} and res.metrics["violations"][0]["line"] == MAX_SOURCE_LINES + 1


def test_huge_source_short_circuits():
    res = check_policy("x" * (5 * MAX_SOURCE_BYTES))
    assert rules_of(res) == {"size-limit"} and res.seconds < 3.0   # short-circuited: no scan of 5x the limit


def test_param_values():
    assert param_violations({"TILE_M": "128", "SCALE": "0.5f", "FLAG": "true", "NEG": "-1", "E": "1e-3"}) == []
    assert [v.rule for v in param_violations({"T": "1);exit(0"})] == ["param-syntax"]
    assert param_violations({"T": "system"})  # an identifier naming a forbidden call
    assert param_violations({"__CUDA_ARCH__": "900"})  # reserved name
    assert param_violations({"A B": "1"})


def test_include_allowlist_unit():
    for ok in ("cute/tensor.hpp", "cutlass/numeric_types.h", "cuda_runtime.h", "cuda_bf16.h", "cuda/barrier",
               "cuda/std/cstdint", "mma.h", "cstdint", "cmath", "type_traits", "evo_abi.h", "cooperative_groups.h"):
        assert include_allowed(ok), ok
    for bad in ("cstdio", "stdio.h", "iostream", "fstream", "cstdlib", "thread", "chrono", "cublas_v2.h",
                "cudnn.h", "cub/cub.cuh", "thrust/sort.h", "torch/extension.h", "/etc/passwd",
                "cute/../../secret", "unistd.h", "dlfcn.h"):
        assert not include_allowed(bad), bad


def test_performance_on_a_large_source():
    # ~190 KB of legit code: the check stays well under a second
    unit = LEGIT_TOP.replace("Tag", "Tag{i}").replace("Pair", "Pair{i}").replace("Mode", "Mode{i}")
    unit = re.sub(r"\b(kTile|kStages|kScale|kNoTable|c_coeffs|smem_dynamic|kInlineConst|lane_id|fence|twice|"
                  r"wait_a_bit|Pipe|member_calls|shared_kernel|detail)\b", r"\1_{i}", unit)
    unit = unit.replace("#define DEVFN __device__ __forceinline__\n", "")
    chunks = ["#define DEVFN __device__ __forceinline__\n"]
    i = 0
    while sum(map(len, chunks)) < 180_000:
        chunks.append(unit.replace("{i}", str(i)))
        i += 1
    src = kernel("".join(chunks))
    assert src.count("\n") < MAX_SOURCE_LINES or True
    res = check_policy(src)
    assert res.seconds < 6.0   # linear: a backtracking scan of 180 kB takes minutes
    assert rules_of(res) <= {"size-limit"}, res.artifacts.get("violations", "")[:2000]


# ---------------------------------------------------------------------------------------------
# Stage wrapper


def test_policy_stage_is_a_stage():
    stage = PolicyStage()
    assert stage.name == "policy"
    good = Candidate.create("t", kernel(), {"BLOCK": "128"})
    assert stage.run(good).passed
    bad = Candidate.create("t", kernel(), {"BLOCK": "1);system(\"x\""})
    res = stage.run(bad)
    assert res.status is Status.REJECTED and rules_of(res) == {"param-syntax"}
    assert pickle.loads(pickle.dumps(stage)) == stage
