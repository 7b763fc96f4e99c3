# optstep — the two commands of the README, and a few more.
#   make demo   installs what is missing, builds, starts a local CPU server and trains through it
#   make test   installs what is missing, builds, runs every test (prints `N passed, N failed`)

.PHONY: deps python-env build demo demo-cpp test bench clean

deps:
	@bazel/install_deps.sh

# .venv with the Python client, torch, pytest, scikit-learn, matplotlib (PyPI; idempotent).
python-env: deps
	@bazel/python_env.sh >/dev/null

build: deps
	bazel build //...

# PyTorch: an MLP on scikit-learn's digits with the Muon + AdamW chain through a local server,
# then AdamW and SOAP for comparison (curves in build/demo/digits_optimizers.png).
demo: python-env
	bazel build //server:optstep_server
	.venv/bin/python client/python/examples/digits_demo.py --plot build/demo/digits_optimizers.png

# C++: the train_mlp example through a local server, AdamW then SGD.
demo-cpp: deps
	bazel build //server:optstep_server //client/cpp/examples:train_mlp
	deploy/local/demo.sh

test: deps
	bazel/run_tests.sh

bench: deps
	bazel run -c opt //bench:kernels_bench

clean:
	bazel clean
