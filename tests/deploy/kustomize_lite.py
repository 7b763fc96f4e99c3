"""A small kustomize subset, enough to render deploy/k8s without the kustomize binary.

Supports exactly what deploy/k8s uses: `resources` (YAML files, or directories with a
kustomization.yaml), `namespace`, `images` (newName / newTag / digest) and `patches` given by
`path` as strategic-merge patches: maps merge recursively; the lists below merge their items by
`name`, as Kubernetes' patchMergeKey does for them; every other list is replaced. Anything else in
a kustomization.yaml is an error, so the subset cannot silently diverge from kustomize (the tests
also compare it with `kubectl kustomize` where kubectl is installed).
"""

import copy
import os

import yaml

SUPPORTED_KEYS = {"apiVersion", "kind", "resources", "namespace", "images", "patches"}
# Lists merged by their items' `name` (patchMergeKey "name" in the Kubernetes API).
MERGE_BY_NAME = {"containers", "initContainers", "env", "volumes", "volumeMounts"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume",
                  "StorageClass", "CustomResourceDefinition", "PriorityClass"}


def _load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def _merge(base, patch, key=None):
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            elif k in out:
                out[k] = _merge(out[k], v, k)
            else:
                out[k] = copy.deepcopy(v)
        return out
    if (key in MERGE_BY_NAME and isinstance(base, list) and isinstance(patch, list)
            and all(isinstance(i, dict) and "name" in i for i in base + patch)):
        # As kustomize's strategic merge orders them: the patch's items first (merged with the
        # base's item of the same name), then the base's other items in their order.
        by_name = {i["name"]: i for i in base}
        out = [_merge(by_name[i["name"]], i) if i["name"] in by_name else copy.deepcopy(i)
               for i in patch]
        patched = {i["name"] for i in patch}
        out += [copy.deepcopy(i) for i in base if i["name"] not in patched]
        return out
    return copy.deepcopy(patch)


def _containers(obj):
    spec = obj.get("spec", {})
    pod = spec.get("template", {}).get("spec", spec if obj.get("kind") == "Pod" else {})
    return pod.get("containers", []) + pod.get("initContainers", [])


def _set_image(obj, image):
    for c in _containers(obj):
        name = c["image"].split("@")[0]
        name, _, _ = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", "")
        if name != image["name"]:
            continue
        new = image.get("newName", name)
        if "digest" in image:
            c["image"] = f"{new}@{image['digest']}"
        else:
            tag = image.get("newTag", c["image"].rpartition(":")[2])
            c["image"] = f"{new}:{tag}"


def render(directory):
    """Returns the objects `kustomize build directory` would print (in resource order)."""
    with open(os.path.join(directory, "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    unknown = set(k) - SUPPORTED_KEYS
    if unknown:
        raise ValueError(f"{directory}: kustomization keys not supported: {sorted(unknown)}")
    objects = []
    for res in k.get("resources", []):
        path = os.path.normpath(os.path.join(directory, res))
        objects += render(path) if os.path.isdir(path) else _load_all(path)
    for patch in k.get("patches", []):
        if set(patch) != {"path"}:
            raise ValueError(f"{directory}: only `patches: - path:` is supported, not {patch}")
        for p in _load_all(os.path.join(directory, patch["path"])):
            matches = [i for i, o in enumerate(objects)
                       if o["kind"] == p["kind"] and o["metadata"]["name"] == p["metadata"]["name"]]
            if len(matches) != 1:
                raise ValueError(f"patch {patch['path']}: {len(matches)} targets")
            objects[matches[0]] = _merge(objects[matches[0]], p)
    for image in k.get("images", []):
        for o in objects:
            _set_image(o, image)
    if "namespace" in k:
        for o in objects:
            if o["kind"] not in CLUSTER_SCOPED:
                o["metadata"]["namespace"] = k["namespace"]
    return objects
