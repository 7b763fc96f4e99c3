"""Two real ranks (Gloo between them) on loopback: the client routes each gradient to its owner
rank and reads the parameters from rank trainer_id % 2; the results equal torch.optim's."""

from __future__ import annotations

import copy
import subprocess
import threading
import uuid
from typing import Iterator

import pytest
import torch

import optstep
from optstep import config
from optstep.torch import RemoteOptimizer
from support import assert_params_close, decay_groups, make_data, make_mlp, train
from test_multi_trainer import _reference
from trainer_worker import MODEL_SEED, NUM_TRAINERS, STEPS, optimizer_config, trainer_batch


@pytest.fixture(scope="module")
def group(server_binary: str) -> Iterator[optstep.LocalGroup]:
    flags = subprocess.run([server_binary, "--helpfull"], capture_output=True, text=True).stdout
    if "--world_size" not in flags:
        pytest.skip("this server build runs one rank only (no --world_size)")
    with optstep.LocalGroup(2, server_binary) as ranks:
        yield ranks


def test_two_ranks_match_torch(group: optstep.LocalGroup) -> None:
    """Only rank 0 is given: rank 1 is found through the layout's advertised addresses."""
    model, x, y = make_mlp(60), *make_data(61)
    reference = copy.deepcopy(model)
    with optstep.Client(group.targets[0]) as client:
        remote = RemoteOptimizer(model, client, optimizer=config.chain(
            config.adamw(lr=1e-2, weight_decay=0.1), clip_grad=0))
        layout = client.layout(remote.session_id)
        assert layout.world_size == 2 and {p.owner for p in layout.params} == {0, 1}
        train(model, remote, x, y, STEPS)
        assert client.num_ranks == 2
    train(reference, torch.optim.AdamW(decay_groups(reference, weight_decay=0.1), lr=1e-2),
          x, y, STEPS)
    assert_params_close(model, reference)


@pytest.mark.parametrize("mode", ["sharded", "replicated"])
def test_two_trainers_on_two_ranks(group: optstep.LocalGroup, mode: str) -> None:
    """Trainer t reads its parameters from rank t; both end equal to the reference. The
    trainers join one after the other (models are made first: torch's seed is global), then
    step concurrently."""
    name = f"ranks-{mode}-{uuid.uuid4().hex[:8]}"
    models = [make_mlp(MODEL_SEED) for _ in range(NUM_TRAINERS)]
    clients = [optstep.Client(rank_targets=group.targets, stream_timeout=60)
               for _ in range(NUM_TRAINERS)]
    optimizers = [RemoteOptimizer(models[t], clients[t], optimizer=optimizer_config(),
                                  session_name=name, trainer_id=t, num_trainers=NUM_TRAINERS,
                                  gradient_mode=mode) for t in range(NUM_TRAINERS)]
    errors = []

    def trainer(t: int) -> None:
        try:
            train(models[t], optimizers[t], *trainer_batch(t, mode), STEPS)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=trainer, args=(t,)) for t in range(NUM_TRAINERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    for client in clients:
        client.close()
    assert not errors, errors
    for (name_, value), a, b in zip(_reference(mode).items(), *(m.parameters() for m in models)):
        assert torch.equal(a, b), name_
        torch.testing.assert_close(a.detach(), torch.from_numpy(value), rtol=1e-6,
                                   atol=1e-6 * abs(value).max())
