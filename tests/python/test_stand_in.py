"""A rank whose process does not return is stood in for by its buddy, in the buddy's process
(docs/deploy.md, "A rank that does not return"). The Python client's steps, on the native and on
the pure-Python data path and through shared memory, wait for that, follow the stand-in's
address by themselves and are never rewound; once the rank's own process is back the client
reaches it again, and the run ends bit for bit with an undisturbed session of the same group.
Rank 0 too: rank 1 stands in for it, and the client learns where from the other ranks."""

from __future__ import annotations

import pathlib
import time
from typing import Dict, Iterator

import numpy as np
import pytest

import optstep
from optstep import config, native, pb
from repository import native_library_path

# The rank lost (1, or 0) is lost for good after 2 s; its buddy (2, or 1) stands in for it.
FLAGS = ["--heartbeat_interval_ms=100", "--peer_timeout_ms=1000", "--state_redundancy=1",
         "--rejoin_timeout_ms=2000"]
# The connect timeout of a client that connects while a rank is stood in.
CONNECT_TIMEOUT = 10.0
WORLD = 3
STEPS = 6
KILLED_AFTER = 2


@pytest.fixture(autouse=True)
def library(monkeypatch: pytest.MonkeyPatch) -> None:
    if not native.library_path().is_file():
        monkeypatch.setenv("OPTSTEP_NATIVE_LIB", native_library_path())


@pytest.fixture
def group(server_binary: str) -> Iterator[optstep.LocalGroup]:
    with optstep.LocalGroup(WORLD, server_binary, flags=FLAGS) as local:
        yield local


def _spec(name: str) -> pb.SessionSpec:
    # Six tensors: each rank owns some.
    return pb.SessionSpec(name=name, num_trainers=1,
                          gradient_mode=pb.GRADIENT_MODE_REPLICATED,
                          parameters=[pb.ParameterSpec(name=f"w{i}", shape=[32 + 8 * i, 5])
                                      for i in range(6)],
                          optimizer=config.chain(config.adamw(lr=1e-2, weight_decay=0.1)))


def _gradients(step: int) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(step)
    return {f"w{i}": rng.standard_normal((32 + 8 * i, 5), dtype=np.float32) for i in range(6)}


def _session(client: optstep.Client, name: str,
             storage: int = pb.PARAMETER_STORAGE_UNSPECIFIED) -> str:
    spec = _spec(name)
    spec.parameter_storage = storage
    info, _ = client.create_session(spec)
    owners = set(client.layout(info.session_id).owners_of(range(6)))
    assert owners == set(range(WORLD)), owners
    return info.session_id


def _parameters(client: optstep.Client, session_id: str) -> Dict[int, np.ndarray]:
    return dict(client.pull_parameters(session_id).params)


@pytest.mark.parametrize("dead,path", [(1, "native"), (1, "python"), (1, "shared"),
                                       (0, "native"), (0, "python"), (0, "shared")])
def test_a_rank_that_does_not_return_is_stood_in_for_until_it_does(
        group: optstep.LocalGroup, server_binary: str, monkeypatch: pytest.MonkeyPatch,
        dead: int, path: str) -> None:
    monkeypatch.setenv("OPTSTEP_NATIVE", "0" if path == "python" else "1")
    assert native.available() == (path != "python")
    # "shared": through memory shared with the ranks, each (the stand-in, the rank back) giving
    # the client a new segment.
    with optstep.Client(rank_targets=group.targets, recovery_timeout=60,
                        shared_memory=path == "shared") as client:
        reference = _session(client, "reference")
        for step in range(1, STEPS + 1):
            client.step(reference, step, _gradients(step))
        sid = _session(client, "stood-in")
        for step in range(1, KILLED_AFTER + 1):
            client.step(sid, step, _gradients(step))
        # Each owner holds its own masters alone: a pull asks every rank.
        owners_sid = _session(client, "owners", pb.PARAMETER_STORAGE_OWNERS)
        client.step(owners_sid, 1, _gradients(1))

        lost = group.ranks[dead]
        own_address = lost.address
        assert own_address is not None
        lost.kill()
        # Waits out the rejoin timeout and the stand-in's heal, then is redone on the stand-in.
        reply = client.step(sid, KILLED_AFTER + 1, _gradients(KILLED_AFTER + 1))
        assert reply.step == KILLED_AFTER + 1
        layout = client.layout(sid, refresh=True)
        assert layout.stood_in_ranks == (dead,)
        assert layout.rank_targets[dead] != own_address
        # A client that connects now, given the lost rank's own address, is led to the
        # stand-in by the first rank that answers, at once (its native data path connects on
        # its first step, the same way).
        connecting = time.monotonic()
        late = optstep.Client(rank_targets=group.targets, connect_timeout=CONNECT_TIMEOUT)
        late.step(sid, KILLED_AFTER + 2, _gradients(KILLED_AFTER + 2))
        assert time.monotonic() - connecting < CONNECT_TIMEOUT / 2, \
            "waited for the lost rank's own address"
        assert late.layout(owners_sid).stood_in_ranks == (dead,)

        # The rank's own process, on its port, takes its place back.
        port = own_address.rsplit(":", 1)[1]
        group.ranks[dead] = optstep.LocalServer(
            server_binary, [f"--rank={dead}", f"--world_size={WORLD}",
                            f"--rendezvous={group.ranks[0].address}", *FLAGS, f"--port={port}"],
            wait_serving=False)
        group.ranks[dead].start()
        lost.close()
        deadline = time.monotonic() + 30
        while True:
            # Rank 0 is away while its stand-in gives way and its own process heals itself in
            # (that process answers before, knowing no session yet): the health check waits for
            # it, as a trainer's recovery does.
            try:
                serving = client.check_health()
            except optstep.UnavailableError:
                serving = False
            if serving:
                layout = client.layout(sid, refresh=True)
                if layout.stood_in_ranks == () and layout.rank_targets[dead] == own_address:
                    break
            assert time.monotonic() < deadline, "the rank's own process did not come back"
            time.sleep(0.1)
        for step in range(KILLED_AFTER + 3, STEPS + 1):
            assert client.step(sid, step, _gradients(step)).step == step
        # The late client still knows the stand-in, which stopped: its pull from the owners
        # follows the rank back to its own process instead of failing UNAVAILABLE.
        with late:
            assert late.pull_parameters(owners_sid).step == 1

        assert (sid, 0) in client._shared._segments or path != "shared"  # noqa: SLF001
        expected = _parameters(client, reference)
        got = _parameters(client, sid)
        assert list(got) == list(expected)
        for pid, values in expected.items():
            np.testing.assert_array_equal(got[pid], values)


CALLS_ON_RANK0 = ["pull", "export", "import", "save", "load"]


@pytest.mark.parametrize("call", CALLS_ON_RANK0)
def test_calls_on_rank0_follow_it_when_its_stand_in_is_gone(
        server_binary: str, tmp_path: pathlib.Path, call: str) -> None:
    """A stand-in for rank 0 that the client last heard of and that stopped since (rank 0's own
    process took its place back, or the group restarted): the parameters, state dict and
    checkpoint calls, as the session calls, find it gone, ask where rank 0 is served now and
    are made there once more."""
    with optstep.LocalServer(server_binary, flags=[f"--checkpoint_root={tmp_path}"]) as local:
        with optstep.Client(local.address) as client:
            info, _ = client.create_session(_spec("rank0-back"))
            sid = info.session_id
            client.step(sid, 1, _gradients(1))
            client.save_checkpoint(sid, "first")
            state = client.export_state_dict(sid)
            # Nothing listens there: as a stand-in that stopped.
            client._ranks.follow(["127.0.0.1:1"], [0])  # noqa: SLF001
            assert client._ranks.rank0().target == "127.0.0.1:1"  # noqa: SLF001
            if call == "pull":
                assert client.pull_parameters(sid).step == 1
            elif call == "export":
                assert sorted(client.export_state_dict(sid)) == sorted(state)
            elif call == "import":
                assert client.import_state_dict(sid, state).tensors == len(state)
            elif call == "save":
                assert client.save_checkpoint(sid, "second").step == 1
            else:
                assert client.load_checkpoint(sid, "first").step == 1
            assert client._ranks.rank0().target == local.address  # noqa: SLF001


def test_a_close_retried_after_its_answer_was_lost_is_done(server_binary: str) -> None:
    """A close whose answer was lost with a stand-in for rank 0 that stopped right after it
    closed the session is made once more where rank 0 is served now, which knows the session no
    more: it is closed, and the client says so. A close answered at its first attempt still says
    NOT_FOUND."""
    with optstep.LocalServer(server_binary) as local:
        with optstep.Client(local.address) as first, optstep.Client(local.address) as client:
            info, _ = client.create_session(_spec("closed-once"))
            first.close_session(info.session_id)  # what the attempt whose answer was lost did
            client._ranks.follow(["127.0.0.1:1"], [0])  # noqa: SLF001
            client.close_session(info.session_id)
            assert client._ranks.rank0().target == local.address  # noqa: SLF001
            with pytest.raises(optstep.NotFoundError):
                client.close_session(info.session_id)
