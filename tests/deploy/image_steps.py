"""Steps a small model through a rank (or group) of optstep images with the Python client, as a
trainer on the host would: `python image_steps.py TARGET STEPS` prints the session's layout (world
size and each parameter's owner) and the SHA-256 of its parameters' fp32 bits after the steps.
Run by tests/deploy/test_images.py with the interpreter that has the client (.venv)."""

import hashlib
import json
import sys

import numpy as np

import optstep
from optstep import config, pb

# Two hidden matrices (Muon) and the rest (AdamW), so that a 2-rank group splits them.
SHAPES = {"w1": [16, 24], "b1": [24], "w2": [24, 12], "b2": [12], "head": [12, 4]}


def main(target: str, steps: int) -> None:
    rng = np.random.default_rng(7)
    spec = pb.SessionSpec(
        name="image-steps", num_trainers=1, gradient_mode=pb.GRADIENT_MODE_REPLICATED,
        parameters=[pb.ParameterSpec(name=n, shape=s) for n, s in SHAPES.items()],
        optimizer=config.muon_chain(rules=[config.rule("adamw", name_glob="head")]))
    with optstep.Client(target, connect_timeout=30) as client:
        info, _ = client.create_session(spec)
        sid = info.session_id
        client.init_parameters(sid, {n: rng.standard_normal(s).astype(np.float32)
                                     for n, s in SHAPES.items()})
        for step in range(1, steps + 1):
            grads = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
            client.step(sid, step, grads, skip_return=True)
        params = client.pull_parameters(sid)
        layout = client.layout(sid)
        digest = hashlib.sha256()
        for p in layout.params:
            digest.update(np.ascontiguousarray(params.params[p.param_id]).tobytes())
        print(json.dumps({"step": params.step, "world_size": layout.world_size,
                          "owners": [p.owner for p in layout.params],
                          "sha256": digest.hexdigest()}))
        client.close_session(sid)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
