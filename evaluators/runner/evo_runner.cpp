// evo_runner.cpp -- the runner: the one process that loads a candidate's .so (issue 40).
//
// It maps buffers the judge owns, loads the candidate, calls evo_launch when told, and reports
// the call's return code, the last CUDA error and an event time. It computes no verdict: the
// judge (evaluators/judge/, trusted, never loads candidate code) decides correctness from its
// own memory and corroborates the time with its own clock. Everything this process says after
// LOAD is said by a process the candidate controls, and the judge parses it as such.
//
// Protocol: evaluators/protocol.py (one ASCII line per command on stdin, one reply per command
// on stdout; at most MAX_LINE bytes). Stdout carries ONLY replies; logs go to stderr.
//
// Two backends from this one source (evaluators/runner/build.py builds both):
//   cuda  nvcc, host code only, cudart static: device 0, one non-blocking stream, CUDA IPC.
//   host  g++ -DEVO_RUNNER_HOST, no CUDA runtime: host files mmap'ed MAP_SHARED, a null
//         stream, CLOCK_MONOTONIC around the call. The CPU stand-in CI uses to test this code.
//
// Usage: evo_runner [--no-seccomp]
//   --no-seccomp  LOAD is allowed without SECCOMP (the user's EVO_SANDBOX_SECCOMP=0).
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(EVO_RUNNER_HOST) && !__has_include(<cuda_runtime.h>)
// No CUDA toolkit headers here: the struct of evaluators/abi/evo_abi.h, which stays the
// source of the ABI (the static_assert below catches a drift in size).
typedef struct CUstream_st* cudaStream_t;
#define EVO_MAX_DIMS 8
struct EvoTensor {
  void* data;
  int32_t dtype;
  int32_t ndim;
  int64_t shape[EVO_MAX_DIMS];
  int64_t strides[EVO_MAX_DIMS];
};
#else
#include "evo_abi.h"
#endif
#ifndef EVO_RUNNER_HOST
#include <cuda_runtime.h>
#endif

static_assert(sizeof(EvoTensor) == 144, "EvoTensor layout differs from evo_abi.h");

namespace {

constexpr const char* kVersion = "2";         // protocol.PROTOCOL_VERSION
constexpr size_t kMaxLine = 1 << 16;           // protocol.MAX_LINE, newline included
constexpr int kMaxBufs = 256;                  // buffer ids 0..255
constexpr int64_t kMaxTensors = 64;            // per side of a CALL
constexpr int64_t kMaxScalars = 64;
#ifdef EVO_RUNNER_HOST
constexpr const char* kBackend = "host";
#else
constexpr const char* kBackend = "cuda";
#endif

typedef int (*LaunchFn)(const EvoTensor*, int, EvoTensor*, int, const double*, int, cudaStream_t);
typedef int64_t (*WorkspaceFn)(const EvoTensor*, int, const EvoTensor*, int, const double*, int);

struct Buf {
  char* base = nullptr;
  uint64_t nbytes = 0;
};

struct State {
  bool no_seccomp = false;   // --no-seccomp: LOAD without SECCOMP
  bool hello = false;
  bool seccomp = false;      // the filter is installed and every thread shows it
  bool load_tried = false;   // one LOAD per process, failed or not
  LaunchFn launch = nullptr;
  WorkspaceFn workspace = nullptr;
  Buf bufs[kMaxBufs];
  char* ws = nullptr;        // the runner's own workspace (device memory, or host memory)
  uint64_t ws_cap = 0;
#ifndef EVO_RUNNER_HOST
  cudaStream_t stream = nullptr;
  cudaEvent_t ev0 = nullptr, ev1 = nullptr;
#endif
} S;

// --- replies (stdout: protocol only) ---------------------------------------------------------

void write_all(const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = write(1, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) _exit(0);  // the judge is gone: nothing left to do
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// One reply line; anything outside printable ASCII (a path, dlerror()) becomes '?'.
void reply(const char* fmt, ...) {
  static char line[kMaxLine];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  size_t len = static_cast<size_t>(n) < sizeof line - 2 ? static_cast<size_t>(n) : sizeof line - 2;
  for (size_t i = 0; i < len; ++i)
    if (line[i] < 0x20 || line[i] > 0x7e) line[i] = '?';
  line[len] = '\n';
  write_all(line, len + 1);
}

// ERR <where> <message>; returns false so handlers can `return err(...)`.
bool err(const char* where, const char* fmt, ...) {
  static char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  reply("ERR %s %s", where, msg);
  return false;
}

// --- input -----------------------------------------------------------------------------------

// One command line from stdin (fd 0, read directly: no stdio buffer shared with the candidate).
// 1: a line; 0: end of input; -1: longer than kMaxLine (consumed up to its newline).
int read_line(std::string& out) {
  static char buf[1 << 16];
  static size_t pos = 0, len = 0;
  out.clear();
  bool too_long = false;
  for (;;) {
    if (pos == len) {
      ssize_t r = read(0, buf, sizeof buf);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return 0;
      pos = 0;
      len = static_cast<size_t>(r);
    }
    char* nl = static_cast<char*>(memchr(buf + pos, '\n', len - pos));
    size_t take = (nl ? static_cast<size_t>(nl - buf) : len) - pos;
    if (!too_long) {
      if (out.size() + take + 1 > kMaxLine) {
        too_long = true;
        out.clear();
      } else {
        out.append(buf + pos, take);
      }
    }
    pos += take;
    if (nl) {
      ++pos;
      return too_long ? -1 : 1;
    }
  }
}

std::vector<std::string> split(const std::string& line, bool* ok) {
  std::vector<std::string> toks;
  *ok = !line.empty();
  size_t i = 0;
  while (*ok && i <= line.size()) {
    size_t j = line.find(' ', i);
    if (j == std::string::npos) j = line.size();
    if (j == i) *ok = false;  // empty token: a double or trailing space
    toks.emplace_back(line, i, j - i);
    i = j + 1;
  }
  for (char c : line)
    if (c < 0x20 || c > 0x7e) *ok = false;
  return toks;
}

bool parse_i64(const std::string& t, int64_t lo, int64_t hi, int64_t* v) {
  if (t.empty() || t.size() > 20) return false;
  size_t i = (t[0] == '-') ? 1 : 0;
  if (i == t.size()) return false;
  for (size_t k = i; k < t.size(); ++k)
    if (t[k] < '0' || t[k] > '9') return false;
  errno = 0;
  char* end = nullptr;
  long long x = strtoll(t.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || x < lo || x > hi) return false;
  *v = x;
  return true;
}

bool parse_f64(const std::string& t, double* v) {
  if (t.empty() || t.size() > 40) return false;
  errno = 0;
  char* end = nullptr;
  double x = strtod(t.c_str(), &end);
  if (errno == ERANGE || *end != '\0') return false;
  *v = x;
  return true;
}

// --- the process -----------------------------------------------------------------------------

// Every fd but 0, 1, 2 (what the process inherited by mistake; the judge starts it with
// close_fds). Called at start (unless --keep-fds), before CUDA opens its own, and before LOAD
// on the host backend.
void close_fds_from_3() {
#ifdef SYS_close_range
  if (syscall(SYS_close_range, 3U, ~0U, 0U) == 0) return;
#endif
  long max = sysconf(_SC_OPEN_MAX);
  for (long fd = 3; fd < (max > 0 && max < 65536 ? max : 65536); ++fd) close(static_cast<int>(fd));
}

#ifndef EVO_RUNNER_HOST
bool cuda_fail(const char* what, cudaError_t e) {
  cudaGetLastError();  // a failed call of ours must not look like the candidate's error later
  return err("cuda", "%s: %s (%d) %s", what, cudaGetErrorName(e), static_cast<int>(e), cudaGetErrorString(e));
}
#endif

// CUDA is started at HELLO, so READY means "context up": the judge's start-up clock sees it.
bool start_backend() {
#ifndef EVO_RUNNER_HOST
  static bool started = false;
  if (started) return true;
  cudaError_t e;
  if ((e = cudaSetDevice(0)) != cudaSuccess) return cuda_fail("cudaSetDevice(0)", e);
  if ((e = cudaFree(nullptr)) != cudaSuccess) return cuda_fail("cudaFree(0) (context creation)", e);
  if ((e = cudaStreamCreateWithFlags(&S.stream, cudaStreamNonBlocking)) != cudaSuccess)
    return cuda_fail("cudaStreamCreateWithFlags", e);
  if ((e = cudaEventCreate(&S.ev0)) != cudaSuccess || (e = cudaEventCreate(&S.ev1)) != cudaSuccess)
    return cuda_fail("cudaEventCreate", e);
  started = true;
#endif
  return true;
}

// --- commands --------------------------------------------------------------------------------

void cmd_hello(const std::vector<std::string>& t) {
  if (t.size() != 2) { err("args", "HELLO takes 1 field"); return; }
  if (t[1] != kVersion) { err("hello", "protocol version %s; this runner speaks %s", t[1].c_str(), kVersion); return; }
  if (!start_backend()) return;
  S.hello = true;
  reply("READY %s %s", kVersion, kBackend);
}

void cmd_map(const std::vector<std::string>& t) {
  int64_t id = 0, nbytes = 0;
  if (t.size() != 5 || !parse_i64(t[1], 0, kMaxBufs - 1, &id) || !parse_i64(t[4], 1, INT64_MAX, &nbytes)) {
    err("args", "MAP <buf 0..%d> <ipc|host> <where> <nbytes >= 1>", kMaxBufs - 1);
    return;
  }
  Buf& b = S.bufs[id];
  if (b.base) { err("map", "buffer %lld is already mapped", static_cast<long long>(id)); return; }
  if (t[2] == "ipc") {
#ifdef EVO_RUNNER_HOST
    err("map", "ipc needs the cuda backend");
#else
    const std::string& hex = t[3];
    cudaIpcMemHandle_t h;
    if (hex.size() != 2 * sizeof h.reserved) { err("args", "an IPC handle is %zu hex digits", 2 * sizeof h.reserved); return; }
    for (size_t i = 0; i < sizeof h.reserved; ++i) {
      int v = 0;
      for (int k = 0; k < 2; ++k) {
        char c = hex[2 * i + k];
        int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
        if (d < 0) { err("args", "IPC handle is not hex"); return; }
        v = v * 16 + d;
      }
      h.reserved[i] = static_cast<char>(v);
    }
    void* p = nullptr;
    cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      cudaGetLastError();
      err("map", "cudaIpcOpenMemHandle: %s (%d)", cudaGetErrorName(e), static_cast<int>(e));
      return;
    }
    b.base = static_cast<char*>(p);
    b.nbytes = static_cast<uint64_t>(nbytes);
    reply("MAPPED %lld", static_cast<long long>(id));
#endif
    return;
  }
  if (t[2] != "host") { err("args", "MAP kind %s: expected ipc or host", t[2].c_str()); return; }
  int fd = open(t[3].c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) { err("map", "open %s: %s", t[3].c_str(), strerror(errno)); return; }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) < static_cast<uint64_t>(nbytes)) {
    close(fd);
    err("map", "%s is not a regular file of at least %lld bytes", t[3].c_str(), static_cast<long long>(nbytes));
    return;
  }
  void* p = mmap(nullptr, static_cast<size_t>(nbytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int mmap_errno = errno;
  close(fd);
  if (p == MAP_FAILED) { err("map", "mmap %s: %s", t[3].c_str(), strerror(mmap_errno)); return; }
  b.base = static_cast<char*>(p);
  b.nbytes = static_cast<uint64_t>(nbytes);
  reply("MAPPED %lld", static_cast<long long>(id));
}

void cmd_seccomp(const std::vector<std::string>& t) {
  if (t.size() != 2) { err("args", "SECCOMP takes 1 field"); return; }
  if (S.seccomp) { err("seccomp", "a filter is already installed"); return; }
  int fd = open(t[1].c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) { err("seccomp", "open %s: %s", t[1].c_str(), strerror(errno)); return; }
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size <= 0 || st.st_size % 8 != 0 || st.st_size > 4096 * 8) {
    close(fd);
    err("seccomp", "%s: expected 1..4096 records of 8 bytes", t[1].c_str());
    return;
  }
  std::vector<sock_filter> prog(static_cast<size_t>(st.st_size) / 8);
  static_assert(sizeof(sock_filter) == 8, "struct sock_filter is 8 bytes");
  size_t got = 0, want = static_cast<size_t>(st.st_size);
  while (got < want) {
    ssize_t r = read(fd, reinterpret_cast<char*>(prog.data()) + got, want - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  close(fd);
  if (got != want) { err("seccomp", "short read of %s", t[1].c_str()); return; }
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) { err("seccomp", "prctl(PR_SET_NO_NEW_PRIVS): %s", strerror(errno)); return; }
  sock_fprog fp;
  fp.len = static_cast<unsigned short>(prog.size());
  fp.filter = prog.data();
  long r = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &fp);
  if (r != 0) {
    if (r > 0) err("seccomp", "thread %ld could not be synchronised", r);
    else err("seccomp", "seccomp(SET_MODE_FILTER, TSYNC): %s", strerror(errno));
    return;
  }
  // every thread (CUDA's among them) must show the filter
  int n = 0, filtered = 0;
  DIR* d = opendir("/proc/self/task");
  if (!d) { err("seccomp", "opendir /proc/self/task: %s", strerror(errno)); return; }
  while (struct dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char path[96];
    snprintf(path, sizeof path, "/proc/self/task/%.20s/status", e->d_name);
    FILE* f = fopen(path, "re");
    if (!f) continue;  // a thread that just exited
    char line[256];
    while (fgets(line, sizeof line, f)) {
      if (strncmp(line, "Seccomp:", 8) == 0) {
        ++n;
        filtered += atoi(line + 8) == 2;
        break;
      }
    }
    fclose(f);
  }
  closedir(d);
  if (n == 0 || filtered != n) { err("seccomp", "only %d of %d threads are filtered after install", filtered, n); return; }
  S.seccomp = true;
  reply("SECCOMPED %d", n);
}

void cmd_load(const std::vector<std::string>& t) {
  if (t.size() != 2) { err("args", "LOAD takes 1 field"); return; }
  if (S.load_tried) { err("load", "one LOAD per process"); return; }
  if (!S.seccomp && !S.no_seccomp) { err("load", "refused: no seccomp filter is installed (send SECCOMP first)"); return; }
  S.load_tried = true;
  // Nothing of the runner's own is open here (inherited fds were closed at start, its files are
  // closed after use). On the host backend every fd above 2 goes; on the cuda backend the ones
  // left are the driver's (/dev/nvidia*, event fds, an MPS socket), which the context needs.
#ifdef EVO_RUNNER_HOST
  close_fds_from_3();
#endif
  dlerror();
  void* h = dlopen(t[1].c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) { const char* e = dlerror(); err("load", "dlopen: %s", e ? e : "failed"); return; }
  S.launch = reinterpret_cast<LaunchFn>(dlsym(h, "evo_launch"));
  if (!S.launch) { err("load", "the shared object exports no evo_launch"); return; }
  S.workspace = reinterpret_cast<WorkspaceFn>(dlsym(h, "evo_workspace_bytes"));
  reply("LOADED %d", S.workspace ? 1 : 0);
}

size_t dtype_size(int64_t code) {
  static const size_t sizes[] = {4, 2, 2, 8, 4, 8, 1, 1};  // EvoDType 0..7
  return (code >= 0 && code < 8) ? sizes[code] : 0;
}

// <buf> <offset> <dtype> <ndim> <shape>... <strides>...; the view must lie inside the buffer.
bool parse_tensor(const std::vector<std::string>& t, size_t* i, EvoTensor* out) {
  int64_t buf, off, dt, nd;
  if (*i + 4 > t.size() || !parse_i64(t[*i], 0, kMaxBufs - 1, &buf) || !parse_i64(t[*i + 1], 0, INT64_MAX, &off) ||
      !parse_i64(t[*i + 2], 0, 7, &dt) || !parse_i64(t[*i + 3], 0, EVO_MAX_DIMS, &nd))
    return err("args", "tensor at token %zu: <buf> <offset> <dtype 0..7> <ndim 0..%d>", *i, EVO_MAX_DIMS);
  *i += 4;
  if (*i + 2 * static_cast<size_t>(nd) > t.size()) return err("args", "tensor of %lld dims: missing shape or strides", static_cast<long long>(nd));
  memset(out, 0, sizeof *out);
  bool empty = false;
  for (int64_t d = 0; d < nd; ++d) {
    if (!parse_i64(t[*i + d], 0, int64_t(1) << 40, &out->shape[d]) ||
        !parse_i64(t[*i + nd + d], -(int64_t(1) << 40), int64_t(1) << 40, &out->strides[d]))
      return err("args", "tensor dim %lld: malformed shape or stride", static_cast<long long>(d));
    empty = empty || out->shape[d] == 0;
  }
  *i += 2 * static_cast<size_t>(nd);
  const Buf& b = S.bufs[buf];
  if (!b.base) return err("args", "buffer %lld is not mapped", static_cast<long long>(buf));
  // byte range [lo, hi) the view touches, in 128-bit arithmetic: no overflow from any input
  __int128 esize = static_cast<__int128>(dtype_size(dt)), lo = off, hi = off;
  if (!empty) {
    __int128 lo_el = 0, hi_el = 0;
    for (int64_t d = 0; d < nd; ++d) {
      __int128 span = static_cast<__int128>(out->shape[d] - 1) * out->strides[d];
      (span >= 0 ? hi_el : lo_el) += span;
    }
    lo = off + lo_el * esize;
    hi = off + (hi_el + 1) * esize;
  }
  if (lo < 0 || hi > static_cast<__int128>(b.nbytes))
    return err("args", "tensor of buffer %lld at offset %lld reaches outside the buffer's %llu bytes",
               static_cast<long long>(buf), static_cast<long long>(off), static_cast<unsigned long long>(b.nbytes));
  out->data = b.base + off;
  out->dtype = static_cast<int32_t>(dt);
  out->ndim = static_cast<int32_t>(nd);
  return true;
}

#ifdef EVO_RUNNER_HOST
double now_ms() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
#endif

void done(int rc, int last_error, double ms) {
  if (!(ms >= 0)) ms = 0;     // NaN or negative
  if (ms > 1e12) ms = 1e12;   // keeps the token short and finite
  reply("DONE %d %d %.6f", rc, last_error, ms);
}

// One timed call: events around evo_launch on the runner's stream (host: the monotonic clock),
// then a device-wide synchronise. NULLCALL (launch == nullptr) does the same around nothing.
void timed_call(std::vector<EvoTensor>& in, std::vector<EvoTensor>& out, int n_out, std::vector<double>& sc) {
  int rc = 0;
#ifdef EVO_RUNNER_HOST
  double t0 = now_ms();
  if (S.launch) rc = S.launch(in.data(), static_cast<int>(in.size()) - 1, out.data(), n_out, sc.data(), static_cast<int>(sc.size()) - 1, nullptr);
  double t1 = now_ms();
  done(rc, 0, t1 - t0);
#else
  cudaEventRecord(S.ev0, S.stream);
  if (S.launch) rc = S.launch(in.data(), static_cast<int>(in.size()) - 1, out.data(), n_out, sc.data(), static_cast<int>(sc.size()) - 1, S.stream);
  cudaEventRecord(S.ev1, S.stream);
  cudaError_t sync = cudaDeviceSynchronize();
  cudaError_t last = cudaGetLastError();
  int e = static_cast<int>(last != cudaSuccess ? last : sync);
  float ms = 0;
  cudaError_t te = cudaEventElapsedTime(&ms, S.ev0, S.ev1);
  if (te != cudaSuccess) {
    cudaGetLastError();
    if (e == 0) e = static_cast<int>(te);
    ms = 0;
  }
  done(rc, e, ms);
#endif
}

void cmd_nullcall(const std::vector<std::string>& t) {
  if (t.size() != 1) { err("args", "NULLCALL takes no field"); return; }
  std::vector<EvoTensor> in(1), out(1);
  std::vector<double> sc(1);
  LaunchFn saved = S.launch;
  S.launch = nullptr;
  timed_call(in, out, 0, sc);
  S.launch = saved;
}

void cmd_call(const std::vector<std::string>& t) {
  if (!S.launch) { err("state", "CALL before a candidate is loaded"); return; }
  size_t i = 1;
  int64_t n_in, n_out, n_sc;
  // one spare slot at the end of each array: non-null pointers when a count is 0, and the
  // workspace tensor appended to the outputs
  if (i >= t.size() || !parse_i64(t[i++], 0, kMaxTensors, &n_in)) { err("args", "CALL <n_in 0..%lld> ...", static_cast<long long>(kMaxTensors)); return; }
  std::vector<EvoTensor> in(static_cast<size_t>(n_in) + 1);
  for (int64_t k = 0; k < n_in; ++k)
    if (!parse_tensor(t, &i, &in[k])) return;
  if (i >= t.size() || !parse_i64(t[i++], 0, kMaxTensors, &n_out)) { err("args", "CALL: <n_out 0..%lld> expected at token %zu", static_cast<long long>(kMaxTensors), i - 1); return; }
  std::vector<EvoTensor> out(static_cast<size_t>(n_out) + 1);
  for (int64_t k = 0; k < n_out; ++k)
    if (!parse_tensor(t, &i, &out[k])) return;
  if (i >= t.size() || !parse_i64(t[i++], 0, kMaxScalars, &n_sc)) { err("args", "CALL: <n_scalars 0..%lld> expected at token %zu", static_cast<long long>(kMaxScalars), i - 1); return; }
  std::vector<double> sc(static_cast<size_t>(n_sc) + 1);
  for (int64_t k = 0; k < n_sc; ++k)
    if (i >= t.size() || !parse_f64(t[i++], &sc[k])) { err("args", "CALL: scalar %lld is not a number", static_cast<long long>(k)); return; }
  if (i != t.size()) { err("args", "CALL: %zu tokens after the scalars", t.size() - i); return; }
  int n_out_all = static_cast<int>(n_out);
  if (S.workspace) {
    int64_t bytes = S.workspace(in.data(), static_cast<int>(n_in), out.data(), static_cast<int>(n_out), sc.data(), static_cast<int>(n_sc));
    if (bytes > 0) {  // <0: the inputs are outside its contract; evo_launch says so itself
      uint64_t need = (static_cast<uint64_t>(bytes) + 255) & ~uint64_t(255);
      if (need > S.ws_cap) {
#ifdef EVO_RUNNER_HOST
        free(S.ws);
        S.ws = static_cast<char*>(aligned_alloc(256, need));
        if (!S.ws) { S.ws_cap = 0; err("workspace", "%lld bytes: out of host memory", static_cast<long long>(bytes)); return; }
#else
        if (S.ws) cudaFree(S.ws);
        S.ws = nullptr;
        cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&S.ws), need);
        if (e != cudaSuccess) {
          cudaGetLastError();
          S.ws = nullptr;
          S.ws_cap = 0;
          err("workspace", "cudaMalloc of %lld bytes: %s", static_cast<long long>(bytes), cudaGetErrorName(e));
          return;
        }
#endif
        S.ws_cap = need;
      }
      // poisoned before every call, outside the timed region (evo_abi.h, "device scratch")
#ifdef EVO_RUNNER_HOST
      memset(S.ws, 0xFF, static_cast<size_t>(bytes));
#else
      cudaMemsetAsync(S.ws, 0xFF, static_cast<size_t>(bytes), S.stream);
#endif
      EvoTensor& w = out[static_cast<size_t>(n_out)];
      memset(&w, 0, sizeof w);
      w.data = S.ws;
      w.dtype = 6;  // EVO_U8
      w.ndim = 1;
      w.shape[0] = bytes;
      w.strides[0] = 1;
      n_out_all += 1;
    }
  }
  timed_call(in, out, n_out_all, sc);
}

}  // namespace

int main(int argc, char** argv) {
  // --keep-fds: started below a profiler (ncu), whose injection library opened its connection
  // to the profiler before main; closing it leaves ncu blind (or crashes the injection).
  bool keep_fds = false;
  for (int a = 1; a < argc; ++a) {
    if (strcmp(argv[a], "--no-seccomp") == 0) {
      S.no_seccomp = true;
    } else if (strcmp(argv[a], "--keep-fds") == 0) {
      keep_fds = true;
    } else {
      fprintf(stderr, "usage: %s [--no-seccomp] [--keep-fds]  (protocol on stdin/stdout: evaluators/protocol.py)\n", argv[0]);
      return 2;
    }
  }
  if (!keep_fds) close_fds_from_3();
  signal(SIGPIPE, SIG_IGN);  // a judge that went away: write() fails and we exit
  std::string line;
  for (;;) {
    int r = read_line(line);
    if (r == 0) _exit(0);  // the judge closed our stdin
    if (r < 0) { err("args", "line longer than %zu bytes", kMaxLine); continue; }
    bool ok = false;
    std::vector<std::string> t = split(line, &ok);
    if (!ok) { err("args", "malformed line (one space between tokens, printable ASCII)"); continue; }
    const std::string& c = t[0];
    if (c == "QUIT") _exit(0);  // no destructors: nothing of the candidate's runs on the way out
    if (c == "HELLO") { cmd_hello(t); continue; }
    if (!S.hello) { err("state", "HELLO first"); continue; }
    if (c == "MAP") cmd_map(t);
    else if (c == "NULLCALL") cmd_nullcall(t);
    else if (c == "SECCOMP") cmd_seccomp(t);
    else if (c == "LOAD") cmd_load(t);
    else if (c == "CALL") cmd_call(t);
    else err("args", "unknown command %.40s", c.c_str());
  }
}
