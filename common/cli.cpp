#include "common/cli.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "common/traffic.hpp"

namespace attn {

long long parse_integer(const std::string& flag, const std::string& text, long long lo, long long hi) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end == text.c_str() || *end != '\0' || errno == ERANGE)
    throw UsageError(flag + " expects an integer, got '" + text + "'");
  if (v < lo || v > hi)
    throw UsageError(flag + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                     text);
  return v;
}

double parse_number(const std::string& flag, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end == text.c_str() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
    throw UsageError(flag + " expects a number, got '" + text + "'");
  return v;
}

Cli::Cli(std::string program, std::string summary) : program_(std::move(program)), summary_(std::move(summary)) {}

Cli& Cli::defaults(const Problem& p) {
  defaults_ = p;
  return *this;
}
Cli& Cli::head_dims(std::vector<int> dims) {
  head_dims_ = std::move(dims);
  return *this;
}
Cli& Cli::dtypes(std::vector<DType> types) {
  dtypes_ = std::move(types);
  return *this;
}
Cli& Cli::sram_default(std::size_t bytes) {
  sram_default_ = bytes;
  return *this;
}

Cli& Cli::faults(std::vector<Fault> f) {
  faults_ = std::move(f);
  return *this;
}

void Cli::add_int(const std::string& flag, int* target, const std::string& help, int lo, int hi) {
  Extra e;
  e.flag = flag, e.help = help, e.kind = "int", e.i = target, e.lo = lo, e.hi = hi;
  extras_.push_back(e);
}
void Cli::add_flag(const std::string& flag, bool* target, const std::string& help) {
  Extra e;
  e.flag = flag, e.help = help, e.kind = "flag", e.b = target;
  extras_.push_back(e);
}
void Cli::add_choice(const std::string& flag, std::string* target, std::vector<std::string> choices,
                     const std::string& help) {
  Extra e;
  e.flag = flag, e.help = help, e.kind = "choice", e.s = target, e.choices = std::move(choices);
  extras_.push_back(e);
}

void Cli::add_int_list(const std::string& flag, std::vector<int>* target, const std::string& help, int lo, int hi) {
  add_int_list(flag, target, help, lo, hi, {});
}

void Cli::add_int_list(const std::string& flag, std::vector<int>* target, const std::string& help, int lo, int hi,
                       std::vector<std::pair<std::string, int>> names) {
  Extra e;
  e.flag = flag, e.help = help, e.kind = "list", e.list = target, e.lo = lo, e.hi = hi, e.names = std::move(names);
  extras_.push_back(e);
}

std::string Cli::usage() const {
  std::ostringstream s;
  const Problem& d = defaults_;
  s << "usage: " << program_ << " [options]\n" << summary_ << "\n\nproblem:\n"
    << "  --n N            query length Nq (and Nk unless --nk)         [" << d.nq << "]\n"
    << "  --nk N           key/value length Nk                          [" << d.nk << "]\n"
    << "  --d D            head dim of Q, K (and V unless --dv)         [" << d.d << "]\n"
    << "  --dv D           head dim of V and O                          [" << d.dv << "]\n"
    << "  --batch B        batch size                                   [" << d.batch << "]\n"
    << "  --heads H        query heads (and KV heads unless --kv-heads) [" << d.heads << "]\n"
    << "  --kv-heads H     key/value heads (GQA when < --heads)         [" << d.kv_heads << "]\n"
    << "  --causal         causal mask, bottom-right aligned when Nq != Nk\n"
    << "  --dtype T        fp32 | fp16 | bf16                           [" << dtype_name(d.dtype) << "]\n"
    << "  --scale S        softmax scale                                [1/sqrt(d)]\n"
    << "  --inputs DIST    normal | mean-shifted | outliers | integers  [normal]\n"
    << "  --seed S         seed of the inputs                           [1]\n"
    << "run:\n"
    << "  --device DEV     cpu | cuda | auto                            [auto]\n"
    << "  --bench          measure the GPU ceilings and run the chapter's sweep\n"
    << "  --sram-bytes M   on-chip budget of the CPU models in bytes     [" << sram_default_ << "]\n"
    << "  --check-all      check every row in fp64, however large the problem\n"
    << "  --inject-fault F put fault F into every implementation it applies to (list: the faults)\n"
    << "  --json           print the report as one JSON object\n"
    << "  --help           this text\n";
  if (!head_dims_.empty()) {
    s << "supported head dims:";
    for (int x : head_dims_) s << " " << x;
    s << "\n";
  }
  if (!extras_.empty()) {
    s << "chapter options:\n";
    for (const auto& e : extras_) {
      std::string f = e.flag + (e.kind == "int" ? " N" : e.kind == "choice" ? " X" : e.kind == "list" ? " K[,K]" : "");
      s << "  " << f << std::string(f.size() < 17 ? 17 - f.size() : 1, ' ') << e.help;
      if (e.kind == "choice") {
        s << " (";
        for (std::size_t k = 0; k < e.choices.size(); ++k) s << (k ? " | " : "") << e.choices[k];
        s << ")";
      }
      s << "\n";
    }
  }
  return s.str();
}

bool Cli::parse(int argc, char** argv, Options* out) const {
  Options o;
  o.problem = defaults_;
  o.sram_bytes = sram_default_;
  bool nk_set = false, dv_set = false, kvh_set = false;
  const long long kMaxDim = 1 << 30;
  for (int a = 1; a < argc; ++a) {
    std::string arg = argv[a], value;
    bool has_inline = false;
    if (const auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_inline = true;
    }
    auto next = [&]() -> std::string {
      if (has_inline) return value;
      if (a + 1 >= argc) throw UsageError(arg + " needs a value");
      return argv[++a];
    };
    auto no_value = [&] {
      if (has_inline) throw UsageError(arg + " takes no value");
    };
    Problem& p = o.problem;
    if (arg == "--help" || arg == "-h") {
      std::cout << usage();
      return false;
    } else if (arg == "--n") {
      p.nq = int(parse_integer(arg, next(), 1, kMaxDim));
      if (!nk_set) p.nk = p.nq;
    } else if (arg == "--nk") {
      p.nk = int(parse_integer(arg, next(), 1, kMaxDim));
      nk_set = true;
    } else if (arg == "--d") {
      p.d = int(parse_integer(arg, next(), 1, 4096));
      if (!dv_set) p.dv = p.d;
    } else if (arg == "--dv") {
      p.dv = int(parse_integer(arg, next(), 1, 4096));
      dv_set = true;
    } else if (arg == "--batch") {
      p.batch = int(parse_integer(arg, next(), 1, kMaxDim));
    } else if (arg == "--heads") {
      p.heads = int(parse_integer(arg, next(), 1, 4096));
      if (!kvh_set) p.kv_heads = p.heads;
    } else if (arg == "--kv-heads") {
      p.kv_heads = int(parse_integer(arg, next(), 1, 4096));
      kvh_set = true;
    } else if (arg == "--causal") {
      no_value();
      p.causal = true;
    } else if (arg == "--dtype") {
      const std::string v = next();
      if (!parse_dtype(v, &p.dtype)) throw UsageError("--dtype must be fp32, fp16 or bf16, got '" + v + "'");
    } else if (arg == "--scale") {
      p.scale = parse_number(arg, next());
      if (!(p.scale > 0)) throw UsageError("--scale must be > 0");
    } else if (arg == "--inputs") {
      const std::string v = next();
      if (!parse_dist(v, &o.dist))
        throw UsageError("--inputs must be normal, mean-shifted, outliers or integers, got '" + v + "'");
    } else if (arg == "--seed") {
      o.seed = uint64_t(parse_integer(arg, next(), 0, (1LL << 62)));
    } else if (arg == "--device") {
      const std::string v = next();
      if (v == "cpu") o.device = DeviceChoice::cpu;
      else if (v == "cuda" || v == "gpu") o.device = DeviceChoice::cuda;
      else if (v == "auto") o.device = DeviceChoice::automatic;
      else throw UsageError("--device must be cpu, cuda or auto, got '" + v + "'");
    } else if (arg == "--bench") {
      no_value();
      o.bench = true;
    } else if (arg == "--sram-bytes") {
      o.sram_bytes = std::size_t(parse_integer(arg, next(), 256, 1LL << 40));
    } else if (arg == "--check-all") {
      no_value();
      o.check_all = true;
    } else if (arg == "--json") {
      no_value();
      o.json = true;
    } else if (arg == "--inject-fault") {
      const std::string v = next();
      if (v == "list") {
        for (Fault f : faults_) std::cout << fault_name(f) << "  " << fault_help(f) << "\n";
        return false;
      }
      const auto it =
          std::find_if(faults_.begin(), faults_.end(), [&](Fault f) { return v == fault_name(f); });
      if (it == faults_.end()) {
        std::string names;
        for (Fault f : faults_) names += (names.empty() ? "" : ", ") + std::string(fault_name(f));
        throw UsageError("--inject-fault: no fault '" + v + "' here (" + (names.empty() ? "none" : names) + ")");
      }
      o.fault = *it;
    } else {
      auto it = std::find_if(extras_.begin(), extras_.end(), [&](const Extra& e) { return e.flag == arg; });
      if (it == extras_.end()) throw UsageError("unknown option '" + arg + "' (see --help)");
      if (it->kind == "flag") {
        no_value();
        *it->b = true;
      } else if (it->kind == "int") {
        *it->i = int(parse_integer(arg, next(), it->lo, it->hi));
      } else if (it->kind == "list") {
        const std::string v = next();
        std::vector<int> ks;
        if (v != "all") {
          std::size_t b = 0;
          for (;;) {
            const std::size_t e = v.find(',', b);
            const std::string item = v.substr(b, e == std::string::npos ? e : e - b);
            const auto named = std::find_if(it->names.begin(), it->names.end(),
                                            [&](const std::pair<std::string, int>& n) { return n.first == item; });
            const int k = named != it->names.end() ? named->second : int(parse_integer(arg, item, it->lo, it->hi));
            if (std::find(ks.begin(), ks.end(), k) != ks.end())
              throw UsageError(arg + ": " + std::to_string(k) + " is given twice");
            ks.push_back(k);
            if (e == std::string::npos) break;
            b = e + 1;
          }
        }
        *it->list = ks;
      } else {
        const std::string v = next();
        if (std::find(it->choices.begin(), it->choices.end(), v) == it->choices.end())
          throw UsageError(arg + " does not accept '" + v + "' (see --help)");
        *it->s = v;
      }
    }
  }
  validate(o.problem);
  if (!head_dims_.empty()) {
    auto ok = [&](int x) { return std::find(head_dims_.begin(), head_dims_.end(), x) != head_dims_.end(); };
    if (!ok(o.problem.d) || !ok(o.problem.dv)) {
      std::string list;
      for (int x : head_dims_) list += (list.empty() ? "" : ", ") + std::to_string(x);
      throw UsageError("head dim " + std::to_string(ok(o.problem.d) ? o.problem.dv : o.problem.d) +
                       " is not supported by this chapter (supported: " + list + ")");
    }
  }
  if (std::find(dtypes_.begin(), dtypes_.end(), o.problem.dtype) == dtypes_.end())
    throw UsageError(std::string("--dtype ") + dtype_name(o.problem.dtype) + " is not supported by this chapter");
  *out = o;
  return true;
}

int run_chapter(int argc, char** argv, const Cli& cli, const std::function<int(const Options&)>& body) {
  try {
    Options o;
    if (!cli.parse(argc, argv, &o)) return 0;
    const int rc = body(o);
    if (rc == 0 && o.fault != Fault::none) {
      // A fault that changes no checked row would read as a pass: never report one.
      std::cerr << cli.program() << ": error: --inject-fault " << fault_name(o.fault)
                << ": every check passed, so no checked row ran with the fault (these options skip every "
                   "implementation it goes into) or the check missed it\n";
      return kExitUsage;
    }
    return rc;
  } catch (const UsageError& e) {
    std::cerr << cli.program() << ": error: " << e.what() << "\n";
    return kExitUsage;
  } catch (const std::bad_alloc&) {
    std::cerr << cli.program() << ": error: out of host memory (try a smaller --n or --batch)\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    std::cerr << cli.program() << ": error: " << what << "\n";
    return kExitUsage;
  }
}

double host_memory_available() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  double kb = 0;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024.0;
  return 8e9;  // unknown: assume a small machine
}

void require_host_memory(double bytes, const std::string& what) {
  const double avail = host_memory_available();
  if (bytes > 0.8 * avail)
    throw UsageError(what + " needs " + format_bytes(bytes) + " of host memory; " + format_bytes(avail) +
                     " is available (try a smaller --n, --batch or --heads)");
}

}  // namespace attn
