"""optstep_fuzz_test: a fuzz target and the test that runs it on its seed corpus.

Under --config=asan (define optstep_sanitizer=asan) the target links libFuzzer and the test fuzzes
for FUZZ_SECONDS; elsewhere it links fuzz_replay_main.cc and the test replays the seeds once.
The code under test gets libFuzzer's coverage instrumentation from .bazelrc (build:asan
--per_file_copt), so only the targets here need the link flag.
"""

def optstep_fuzz_test(name, srcs, deps, corpus, size = "medium"):
    """Declares cc_binary `name` and sh_test `name`_test over tests/fuzz/corpus/`corpus`.

    Args:
      name: the fuzz target (LLVMFuzzerTestOneInput in `srcs`).
      srcs: its sources.
      deps: the libraries it fuzzes.
      corpus: the folder of seeds under tests/fuzz/corpus/.
      size: the test's size.
    """
    native.cc_binary(
        name = name,
        testonly = True,
        srcs = srcs,
        copts = select({
            ":libfuzzer": ["-fsanitize=fuzzer-no-link"],
            "//conditions:default": [],
        }),
        linkopts = select({
            ":libfuzzer": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        deps = deps + [":fuzz_util"] + select({
            ":libfuzzer": [],
            "//conditions:default": [":fuzz_replay_main"],
        }),
    )
    native.sh_test(
        name = name + "_test",
        size = size,
        srcs = ["run_fuzzer.sh"],
        args = [
            "$(rootpath :%s)" % name,
            "tests/fuzz/corpus/" + corpus,
        ],
        data = [":" + name] + native.glob(["corpus/%s/*" % corpus]),
        tags = ["fuzz"],
    )
