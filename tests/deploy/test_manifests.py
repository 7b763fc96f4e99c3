"""deploy/k8s and deploy/docker: render base and overlays, validate them against the Kubernetes
API schemas (kubernetes-validate) and security policies (checkov), and check the rank contract of
docs/deploy.md. Runs in .venv-deploy (bazel/deploy_env.sh) from bazel/run_tests.sh."""

import ast
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from kustomize_lite import render

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
K8S = os.path.join(ROOT, "deploy", "k8s")
DOCKER = os.path.join(ROOT, "deploy", "docker")
TARGETS = ["base", "overlays/cpu", "overlays/gpu", "overlays/tls"]
# The oldest Kubernetes the manifests are meant for (native gRPC probes are GA since 1.27) and the
# newest whose schemas kubernetes-validate ships.
# checkov checks skipped by an inline checkov.io/skip annotation (with the reason) in deploy/k8s.
ALLOWED_SKIPS = {"CKV_K8S_43"}  # image by digest: pinned by tag, digest pinning documented
K8S_VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]


def objects_of(target):
    return render(os.path.join(K8S, target))


def one(objects, kind, name=None):
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"{kind} {name}: {len(found)} objects"
    return found[0]


def container(objects):
    sts = one(objects, "StatefulSet")
    return sts, sts["spec"]["template"]["spec"], sts["spec"]["template"]["spec"]["containers"][0]


def env_of(c):
    return {e["name"]: e for e in c.get("env", [])}


def grpc_port(c):
    return next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")


# --- rendering ---------------------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
def test_renders(target):
    kinds = sorted(o["kind"] for o in objects_of(target))
    assert kinds == sorted(["Namespace", "ConfigMap", "PersistentVolumeClaim", "Service",
                            "Service", "StatefulSet", "PodDisruptionBudget", "NetworkPolicy"])


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with kustomize) not installed")
@pytest.mark.parametrize("target", TARGETS)
def test_renderer_agrees_with_kubectl_kustomize(target):
    out = subprocess.run(["kubectl", "kustomize", os.path.join(K8S, target)], check=True,
                         capture_output=True, text=True).stdout
    key = lambda o: (o["kind"], o["metadata"]["name"])  # noqa: E731
    theirs = sorted((d for d in yaml.safe_load_all(out) if d), key=key)
    ours = sorted(objects_of(target), key=key)
    assert ours == theirs


# --- validators --------------------------------------------------------------------------------

@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("target", TARGETS)
def test_kubernetes_schemas(target, version):
    for obj in objects_of(target):
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("target", TARGETS)
def test_checkov_has_no_failed_check(target, tmp_path):
    manifest = tmp_path / "rendered.yaml"
    manifest.write_text(yaml.safe_dump_all(objects_of(target), sort_keys=False))
    checkov = os.path.join(os.path.dirname(sys.executable), "checkov")
    proc = subprocess.run([checkov, "-f", str(manifest), "--framework", "kubernetes",
                           "--output", "json", "--compact", "--skip-download"],
                          capture_output=True, text=True)
    report = json.loads(proc.stdout)
    reports = report if isinstance(report, list) else [report]
    failed = [f"{c['check_id']} {c['resource']}: {c['check_name']}"
              for r in reports for c in r.get("results", {}).get("failed_checks", [])]
    passed = sum(r.get("summary", {}).get("passed", 0) for r in reports)
    assert not failed, "\n".join(failed)
    assert passed > 50, proc.stdout[-2000:]
    # The only exceptions are the inline annotations, each with its reason.
    skipped = {c["check_id"]: c["check_result"].get("suppress_comment", "")
               for r in reports for c in r.get("results", {}).get("skipped_checks", [])}
    assert set(skipped) == ALLOWED_SKIPS, skipped
    assert all(len(reason) > 20 for reason in skipped.values()), skipped


# --- the rank contract (docs/deploy.md) --------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
def test_rank_contract(target):
    objects = objects_of(target)
    sts, pod, c = container(objects)
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    env = env_of(c)
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert int(env["OPTSTEP_WORLD_SIZE"]["value"]) == sts["spec"]["replicas"]
    assert not any(a.startswith(("--rank=", "--world_size=")) for a in c["args"])

    port = grpc_port(c)
    name, svc = sts["metadata"]["name"], sts["spec"]["serviceName"]
    peers = one(objects, "Service", svc)
    assert peers["spec"]["clusterIP"] == "None"
    assert peers["spec"]["publishNotReadyAddresses"] is True  # rank 0 is found before it is ready
    assert peers["spec"]["ports"][0]["port"] == port
    labels = pod and sts["spec"]["template"]["metadata"]["labels"]
    assert peers["spec"]["selector"].items() <= labels.items()
    args = dict(a.split("=", 1) for a in c["args"])
    assert args["--rendezvous"] == f"{name}-0.{svc}.$(POD_NAMESPACE).svc:{port}"
    assert args["--advertise_host"] == f"$(POD_NAME).{svc}.$(POD_NAMESPACE).svc"

    client = one(objects, "Service", name)
    assert client["spec"]["selector"]["statefulset.kubernetes.io/pod-name"] == f"{name}-0"
    assert client["spec"]["ports"][0]["targetPort"] == "grpc"

    flags = server_flags(objects)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if "--tls_cert" in flags:  # native gRPC probes cannot speak TLS
            command = c[probe]["exec"]["command"]
            assert "grpc" not in c[probe], probe
            # The liveness probe asks the process alone, not its peers (rejoin waits).
            service = ["optstep.liveness"] if probe == "livenessProbe" else []
            assert command[:3 + len(service)] == ["optstep", "health", *service,
                                                  f"--server=127.0.0.1:{port}"], probe
            assert f"--tls_cert={flags['--tls_cert']}" in command, probe
            assert f"--tls_ca={flags['--tls_client_ca']}" in command, probe
            timeout_ms = int(next(a for a in command if a.startswith("--timeout_ms="))[13:])
            assert timeout_ms < 1000 * c[probe].get("timeoutSeconds", 1), probe
        elif probe == "livenessProbe":  # the process alone, not its peers (rejoin waits)
            assert c[probe]["grpc"] == {"port": port, "service": "optstep.liveness"}, probe
        else:
            assert c[probe]["grpc"] == {"port": port}, probe
    # The startup probe outlasts the rendezvous timeout, so a slow group is not killed early.
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] * 1000 > \
        int(flags["--comm_timeout_ms"])
    assert int(flags["--port"]) == port
    assert flags["--host"] == "0.0.0.0"
    assert "--flagfile=/etc/optstep/server.flags" in c["args"]


@pytest.mark.parametrize("target", TARGETS)
def test_a_broken_group_heals_by_itself(target):
    """docs/deploy.md, "Failure handling": a rank that lost a peer exits, the kubelet restarts
    it, all ranks restart together and rank 0 restores the sessions of the automatic
    checkpoints."""
    objects = objects_of(target)
    sts, pod, c = container(objects)
    flags = server_flags(objects)
    assert flags["--exit_on_peer_loss"] == "true"
    assert sts["spec"]["template"]["spec"].get("restartPolicy", "Always") == "Always"
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    assert flags["--checkpoint_root"]
    assert int(flags["--checkpoint_every_steps"]) > 0
    assert float(flags["--checkpoint_every_seconds"]) > 0
    assert int(flags["--keep_auto_checkpoints"]) >= 2  # a save cut by a crash leaves one


def server_flags(objects):
    text = one(objects, "ConfigMap", "optstep-flags")["data"]["server.flags"]
    return dict(line.split("=", 1) for line in text.split())


@pytest.mark.parametrize("target", TARGETS)
def test_flags_are_server_flags(target):
    with open(os.path.join(ROOT, "server", "main.cc")) as f:
        known = set(re.findall(r"ABSL_FLAG\([\w:]+,\s*(\w+),", f.read()))
    objects = objects_of(target)
    _, _, c = container(objects)
    used = [k[2:] for k in server_flags(objects)]
    used += [a.split("=", 1)[0][2:] for a in c["args"] if a.split("=", 1)[0] != "--flagfile"]
    assert set(used) <= known, set(used) - known


@pytest.mark.parametrize("target", TARGETS)
def test_security_context(target):
    objects = objects_of(target)
    sts, pod, c = container(objects)
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert "add" not in sc["capabilities"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(c["resources"][kind]), kind
    image = c["image"]
    assert re.search(r":[\w.-]+$", image) and not image.endswith(":latest"), image
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["checkpoints"] == "/var/lib/optstep/checkpoints"
    assert one(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= \
        sts["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize("target", TARGETS)
def test_checkpoints_are_one_file_system_shared_by_every_rank(target):
    # Rank 0 prepares <root>/.<name>.<save>.tmp, every rank writes its shard into it, rank 0 writes
    # the manifest and renames it (docs/checkpoints.md): every rank must see the same directory.
    objects = objects_of(target)
    sts, pod, c = container(objects)
    root = server_flags(objects)["--checkpoint_root"]
    mount = [m for m in c["volumeMounts"] if m["mountPath"].rstrip("/") == root.rstrip("/")]
    assert len(mount) == 1, f"--checkpoint_root={root} is no volume mount"
    mount = mount[0]
    assert not mount.get("readOnly") and not {"subPath", "subPathExpr"} & set(mount), mount
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert set(volume) == {"name", "persistentVolumeClaim"}, volume
    assert not volume["persistentVolumeClaim"].get("readOnly")
    # One claim for the group, not one per pod from volumeClaimTemplates.
    assert "volumeClaimTemplates" not in sts["spec"]
    claim = one(objects, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["metadata"].get("namespace") == sts["metadata"].get("namespace")
    assert "storage" in claim["spec"]["resources"]["requests"]
    # Nothing else in the flags or args names another root.
    assert not [a for a in c["args"] if a.startswith("--checkpoint_root=")]


@pytest.mark.parametrize("target", TARGETS)
def test_no_volume_mount_inside_another(target):
    # A mount point inside another volume (a Secret inside the read-only ConfigMap mount) has to
    # be created in that volume, which fails on common runtimes.
    _, pod, _ = container(objects_of(target))
    for c in pod["containers"] + pod.get("initContainers", []):
        paths = [m["mountPath"].rstrip("/") for m in c.get("volumeMounts", [])]
        assert len(set(paths)) == len(paths), paths
        nested = [(outer, inner) for outer in paths for inner in paths
                  if inner.startswith(outer + "/")]
        assert not nested, f"{c['name']}: mounts inside mounts: {nested}"


@pytest.mark.parametrize("target", TARGETS)
def test_network_policy_admits_only_trainers_and_peers(target):
    objects = objects_of(target)
    sts, _, c = container(objects)
    labels = sts["spec"]["template"]["metadata"]["labels"]
    policy = one(objects, "NetworkPolicy")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["policyTypes"] == ["Ingress"]
    outside = {"optstep.io/trainer": "true", "optstep.io/metrics-scraper": "true"}
    sources = [src for rule in policy["ingress"] for src in rule["from"]]
    for src in sources:
        selected = src["podSelector"]["matchLabels"]
        assert selected.items() <= outside.items() or selected.items() <= labels.items()

    def ports_open_to(label):
        rules = [r for r in policy["ingress"]
                 if r["from"][0]["podSelector"]["matchLabels"] == {label: "true"}]
        assert len(rules) == 1, label
        return [p["port"] for p in rules[0]["ports"]]

    assert ports_open_to("optstep.io/trainer") == [grpc_port(c), stand_in_port(c)]
    assert ports_open_to("optstep.io/metrics-scraper") == [metrics_port(c)]


def metrics_port(c):
    return next(p["containerPort"] for p in c["ports"] if p["name"] == "metrics")


def stand_in_port(c):
    return next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc-stand-in")


@pytest.mark.parametrize("target", TARGETS)
def test_a_stand_in_listens_where_trainers_may_reach_it(target):
    """The stand-in a rank runs for a lost predecessor listens on the port the container
    declares, which is not the rank's own (docs/deploy.md, "A rank that does not return")."""
    objects = objects_of(target)
    _, _, c = container(objects)
    flags = server_flags(objects)
    assert int(flags["--stand_in_port"]) == stand_in_port(c) != grpc_port(c)
    assert flags.get("--stand_in", "true") == "true"


@pytest.mark.parametrize("target", TARGETS)
def test_metrics_are_scraped_from_every_rank(target):
    objects = objects_of(target)
    sts, _, c = container(objects)
    port = metrics_port(c)
    assert int(server_flags(objects)["--metrics_port"]) == port
    annotations = sts["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] == "/metrics"
    peers = one(objects, "Service", sts["spec"]["serviceName"])
    assert {"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"} in \
        peers["spec"]["ports"]


def test_tls_overlay():
    objects = objects_of("overlays/tls")
    _, pod, c = container(objects)
    flags = server_flags(objects)
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {"tls": "optstep-tls", "tokens": "optstep-tokens"}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["tls"]["readOnly"] and mounts["tokens"]["readOnly"]
    tls_dir, tokens_dir = mounts["tls"]["mountPath"], mounts["tokens"]["mountPath"]
    for flag in ("--tls_cert", "--tls_key", "--tls_client_ca"):
        assert flags[flag].startswith(tls_dir + "/"), flag
    assert flags["--auth_tokens_file"].startswith(tokens_dir + "/")
    # Tenants have identities here: one owner's share of a rank is bounded (docs/security.md).
    assert flags["--max_sessions_per_owner"] == "16"
    assert flags["--owner_memory_share"] == "0.5"
    # Nothing else of the CPU overlay changed.
    cpu = server_flags(objects_of("overlays/cpu"))
    assert {k: v for k, v in flags.items() if k not in cpu} == {
        k: flags[k] for k in ("--tls_cert", "--tls_key", "--tls_client_ca", "--auth_tokens_file",
                              "--max_sessions_per_owner", "--owner_memory_share")}
    assert {k: flags[k] for k in cpu} == cpu
    # No Secret is part of the manifests: they are created out of band.
    assert not [o for o in objects if o["kind"] == "Secret"]


def test_gpu_overlay():
    objects = objects_of("overlays/gpu")
    _, pod, c = container(objects)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["image"].endswith("-cuda")
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert server_flags(objects)["--device"] == "cuda"
    # The base's mounts survive the patch.
    assert {m["name"] for m in c["volumeMounts"]} == {"flags", "checkpoints", "tmp", "dshm"}


def test_cpu_overlay():
    objects = objects_of("overlays/cpu")
    _, _, c = container(objects)
    assert "nvidia.com/gpu" not in c["resources"]["limits"]
    assert c["image"].endswith("-cpu")
    assert server_flags(objects)["--device"] == "cpu"


# --- images ------------------------------------------------------------------------------------

def stage(dockerfile, name=None, **build_args):
    """The text of stage `name` (default: the final one) and of the stages it is built FROM, in
    the Dockerfile; `${ARG}`s take `build_args`, else their defaults."""
    with open(os.path.join(DOCKER, dockerfile)) as f:
        text = f.read().replace("\\\n", " ")
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", text, flags=re.M), **build_args)
    resolve = lambda line: re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], line)  # noqa: E731
    stages = [resolve(s.split("\n", 1)[0]) + "\n" + s.split("\n", 1)[1]
              for s in re.split(r"^FROM ", text, flags=re.M)[1:]]
    named = {m.group(2): (m.group(1), s) for s in stages
             for m in [re.match(r"(\S+) AS (\S+)", s)] if m}
    base, body = named[name] if name else (stages[-1].split()[0], stages[-1])
    chain = [body]
    while base in named:
        base, body = named[base]
        chain.insert(0, body)
    return "\n".join(chain)


def final_stage(dockerfile, **build_args):
    with open(os.path.join(DOCKER, dockerfile)) as f:
        text = f.read().replace("\\\n", " ")
    return text, stage(dockerfile, **build_args)


def installed(text):
    return set(" ".join(re.findall(r"apt-get install (.*?)(?:&&|$)", text, flags=re.M)).split())


# The Debian 12 package that holds each library the binaries link (-l<name>, a glob, and
# -fopenmp's libgomp); None: in libc6, or linked statically. test_dockerfile_runtime_libraries
# fails for a linked library missing here: add its package here and to the runtime stages.
RUNTIME_PACKAGES = {
    "absl_*": "libabsl20220623",
    "protobuf": "libprotobuf32",
    "grpc++_reflection": "libgrpc++1.51", "grpc++": "libgrpc++1.51",
    "grpc": "libgrpc29", "gpr": "libgrpc29", "address_sorting": "libgrpc29", "upb": "libgrpc29",
    "re2": "libre2-9", "cares": "libc-ares2", "ssl": "libssl3", "crypto": "libssl3",
    "z": "zlib1g", "glog": "libgoogle-glog0v6", "gflags": "libgflags2.2",
    "openblas": "libopenblas0-pthread", "lapacke": "liblapacke", "gloo": "libgloo0",
    "dnnl": "libdnnl2",
    "prometheus-cpp-core": "libprometheus-cpp-core1.0", "gomp": "libgomp1",
    "pthread": None, "dl": None, "rt": None, "m": None,
    # CUDA (--config=cuda), from NVIDIA's repository; cudart is linked statically.
    "cudart_static": None, "cublasLt": "libcublas-${CUDA_MAJOR_MINOR}",
    "cublas": "libcublas-${CUDA_MAJOR_MINOR}", "cusolver": "libcusolver-${CUDA_MAJOR_MINOR}",
    "nccl": "libnccl2",
}
# The external repositories of WORKSPACE (new_local_repository build files).
EXTERNAL_BUILD = {"system": "third_party/system/BUILD.system",
                  "cuda": "third_party/system/BUILD.cuda"}
# Dependencies that the macros of bazel/*.bzl add to the targets they make.
MACRO_DEPS = {
    "optstep_cc_proto_library": lambda kw, cuda:
        ["@system//:protobuf"] + (["@system//:grpc"] if kw.get("grpc_srcs") else []),
    "optstep_cuda_library": lambda kw, cuda: ["@cuda//:cudart"] if cuda else [],
}
# install_deps.sh packages that only the tests need (the fuzz test's clang, certificates, venvs).
TEST_ONLY_PACKAGES = {"clang", "libclang-rt-dev", "openssl", "python3-venv"}


def _evaluate(node, names, cuda):
    """The value of a BUILD expression: literals, +, names bound at the top, select() / if_cuda()
    in the configuration `cuda`; glob() and cuda_only() as [] (no dependency)."""
    ev = lambda n: _evaluate(n, names, cuda)  # noqa: E731
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [ev(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {ev(k): ev(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return ev(node.left) + ev(node.right)
    if isinstance(node, ast.Name):
        return names[node.id]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        args, kw = [ev(a) for a in node.args], {k.arg: ev(k.value) for k in node.keywords}
        if node.func.id == "select":
            return args[0]["//:cuda" if cuda and "//:cuda" in args[0] else "//conditions:default"]
        if node.func.id == "if_cuda":
            return args[0] if cuda else (args[1:] or [kw.get("if_false", [])])[0]
        if node.func.id in ("glob", "cuda_only"):
            return []
    raise ValueError(f"BUILD expression not understood: {ast.dump(node)}")


def _targets(package, cuda):
    """{name: (deps, linkopts)} of a package (a workspace path, or "@repo")."""
    if package.startswith("@"):
        path = EXTERNAL_BUILD[package[1:]]
    else:
        path = os.path.join(package, "BUILD")
    with open(os.path.join(ROOT, path)) as f:
        tree = ast.parse(f.read(), path)
    names, targets = {}, {}

    def add(call, names):
        kw = {k.arg: k.value for k in call.keywords if k.arg in ("name", "deps", "linkopts",
                                                                   "grpc_srcs")}
        if "name" not in kw:
            return  # load(), package(), exports_files()
        kw = {k: _evaluate(v, names, cuda) for k, v in kw.items()}
        deps = kw.get("deps", []) + MACRO_DEPS.get(call.func.id, lambda *_: [])(kw, cuda)
        targets[kw["name"]] = (deps, kw.get("linkopts", []))

    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            names[stmt.targets[0].id] = _evaluate(stmt.value, names, cuda)
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            add(stmt.value, names)
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.ListComp):
            # [rule(...) for a, b in [...]]: one target per element.
            (loop,), call = stmt.value.generators, stmt.value.elt
            bound = [t.id for t in getattr(loop.target, "elts", [loop.target])]
            for values in _evaluate(loop.iter, names, cuda):
                values = values if len(bound) > 1 else [values]
                add(call, dict(names, **dict(zip(bound, values))))
    return targets


def _label(label, package):
    if label.startswith(":"):
        return package, label[1:]
    repo, _, rest = label.partition("//") if label.startswith("@") else ("", "", label[2:])
    pkg, _, name = rest.partition(":")
    return (repo or pkg), (name or pkg.rsplit("/", 1)[-1])


def linked_libraries(binaries, cuda):
    """The libraries the binaries link: the -l options (and -fopenmp) of every target they depend
    on, in the BUILD files and third_party/system, plus .bazelrc's --linkopt."""
    configs, opts = ({"build", "build:cuda"} if cuda else {"build"}), []
    with open(os.path.join(ROOT, ".bazelrc")) as f:
        for words in (line.split() for line in f):
            if words and words[0] in configs:
                opts += [w[len("--linkopt="):] for w in words[1:] if w.startswith("--linkopt=")]
    packages, seen, todo = {}, set(), [_label(b, "") for b in binaries]
    while todo:
        package, name = todo.pop()
        if (package, name) in seen:
            continue
        seen.add((package, name))
        if package not in packages:
            packages[package] = _targets(package, cuda)
        deps, linkopts = packages[package][name]
        opts += linkopts
        todo += [_label(d, package) for d in deps]
    libs = {o[2:] for o in opts if o.startswith("-l")}
    return libs | ({"gomp"} if "-fopenmp" in opts else set())


# The images' final stages (the default one, and the other targets meant to be run) and the stages
# that build their binaries.
FINAL_STAGES = [("Dockerfile.cpu", "runtime"), ("Dockerfile.cpu", "prebuilt"),
                ("Dockerfile.cuda", "runtime"), ("Dockerfile.cuda", "runtime-apt")]
BUILD_STAGES = [("Dockerfile.cpu", "build"), ("Dockerfile.cuda", "build"),
                ("Dockerfile.cuda", "build-apt")]


@pytest.mark.parametrize("dockerfile,target", FINAL_STAGES)
def test_dockerfile(dockerfile, target):
    text, final = final_stage(dockerfile)
    if target != "runtime":
        final = stage(dockerfile, target)
    else:  # the default target is the last stage
        assert re.split(r"^FROM ", text, flags=re.M)[-1].split()[2] == "runtime"
    assert re.search(r"bazel .*build .*//server:optstep_server //client/cli:optstep", text)
    assert ("--config=cuda" in text) == (dockerfile == "Dockerfile.cuda")
    user = re.search(r"^USER (\S+)", final, flags=re.M).group(1)
    assert user.split(":")[0] not in ("root", "0")
    assert re.search(r'^HEALTHCHECK .*CMD \["optstep", .*"health"\]', final, flags=re.M)
    installs = " ".join(re.findall(r"apt-get install (.*?)(?:&&|$)", final, flags=re.M))
    for tool in ("bazel", "g++", "gcc", "make", "-dev", "nvcc", "curl"):
        assert tool not in installs, tool
    assert os.path.exists(os.path.join(DOCKER, dockerfile + ".dockerignore"))


@pytest.mark.parametrize("dockerfile,target", [f for f in FINAL_STAGES if f[1] != "prebuilt"])
def test_dockerfile_runtime_libraries(dockerfile, target):
    cuda = dockerfile == "Dockerfile.cuda"
    libs = linked_libraries(["//server:optstep_server", "//client/cli:optstep"], cuda=cuda)
    assert {"grpc++", "protobuf", "prometheus-cpp-core", "gomp"} <= libs, libs  # the walk works
    packages = {lib: [p for pattern, p in RUNTIME_PACKAGES.items()
                      if fnmatch.fnmatchcase(lib, pattern)] for lib in libs}
    unknown = sorted(lib for lib, p in packages.items() if not p)
    assert not unknown, f"linked, but no runtime package in RUNTIME_PACKAGES: {unknown}"
    needed = {p[0] for p in packages.values()} - {None}
    final = stage(dockerfile, target)
    if cuda and target == "runtime":
        # CUDA from the wheels: the build stage copies what ldd finds under /usr/local/cuda into
        # /out/cuda-lib, which this stage takes; the rest from Debian.
        needed = {p for p in needed if not p.startswith(("libcublas", "libcusolver", "libnccl"))}
        assert "ldd /out/optstep_server /out/optstep" in stage(dockerfile, "build")
        assert re.search(r"^COPY --from=build /out/cuda-lib/ /usr/local/cuda/lib64/", final,
                         flags=re.M)
    missing = sorted(needed - installed(final))
    assert not missing, f"{dockerfile}: stage {target} lacks {missing}"


@pytest.mark.parametrize("dockerfile,build", BUILD_STAGES)
def test_dockerfile_build_stage_has_the_packages_of_install_deps(dockerfile, build):
    with open(os.path.join(ROOT, "bazel", "install_deps.sh")) as f:
        listed = re.search(r"^PACKAGES=\((.*?)^\)", f.read(), flags=re.M | re.S).group(1)
    packages = set(re.sub(r"#.*", "", listed).split())
    assert {"prometheus-cpp-dev", "libgrpc++-dev"} <= packages, packages
    missing = sorted(packages - TEST_ONLY_PACKAGES - installed(stage(dockerfile, build)))
    assert not missing, f"{dockerfile}: stage {build} lacks {missing}"


def test_dockerignore_keeps_bazel_outputs_out():
    for name in ("Dockerfile.cpu.dockerignore", "Dockerfile.cuda.dockerignore"):
        with open(os.path.join(DOCKER, name)) as f:
            lines = {l.strip() for l in f if l.strip() and not l.startswith("#")}
        assert {"bazel-*", ".git", ".venv", ".venv-*"} <= lines  # .venv-deploy, .venv-compare
