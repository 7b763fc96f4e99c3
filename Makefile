# optstep — the two commands of the README, and a few more.
#   make demo   installs what is missing, builds, starts a local CPU server and trains through it
#   make test   installs what is missing, builds, runs every test (prints `N passed, N failed`)

.PHONY: deps build demo test bench clean

deps:
	@bazel/install_deps.sh

build: deps
	bazel build //...

demo: deps
	bazel build //server:optstep_server //client/cpp/examples:train_mlp
	deploy/local/demo.sh

test: deps
	bazel/run_tests.sh

bench: deps
	bazel run -c opt //bench:kernels_bench

clean:
	bazel clean
