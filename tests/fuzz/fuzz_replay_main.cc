// The main() of a fuzz target where libFuzzer is not linked (the default GCC build): runs
// LLVMFuzzerTestOneInput once on every file named on the command line or found in a directory
// named there, so the seed corpus is a regression test of the target. Arguments that start with
// '-' are libFuzzer's flags and are ignored, so run_fuzzer.sh calls either binary the same way.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;

bool RunFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "fuzz_replay: cannot read %s\n", path.c_str());
    return false;
  }
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int inputs = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.empty() || arg[0] == '-') continue;
    std::error_code error;
    if (fs::is_directory(arg, error)) {
      std::vector<fs::path> files;
      for (const fs::directory_entry& entry : fs::directory_iterator(arg, error)) {
        if (entry.is_regular_file(error)) files.push_back(entry.path());
      }
      if (error) {
        std::fprintf(stderr, "fuzz_replay: cannot list %s: %s\n", arg.c_str(),
                     error.message().c_str());
        return 1;
      }
      for (const fs::path& file : files) {
        if (!RunFile(file)) return 1;
        ++inputs;
      }
    } else {
      if (!RunFile(arg)) return 1;
      ++inputs;
    }
  }
  std::printf("fuzz_replay: %d inputs ran without a failure\n", inputs);
  return 0;
}
