"""`ditto-fast batch --ray` on a real local Ray (2 CPUs, two actors): same outputs as without Ray, a killed
actor's job retried on the other, and a clear exit 2 when Ray is missing."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

import imageio_ffmpeg
import numpy as np

from ditto_fast.engine.options import EngineOptions
from ditto_fast.engine.request import RenderRequest
from ditto_fast.batch.jobs import Job
from ditto_fast.cli import main
from ditto_fast.media.ffpipe import container_comment

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")


def _frames(path) -> np.ndarray:
    gen = imageio_ffmpeg.read_frames(str(path))
    w, h = next(gen)["size"]
    return np.stack([np.frombuffer(f, np.uint8).reshape(h, w, 3) for f in gen])


def _jobs(clips, out):
    return [Job(i, RenderRequest("anchor", clips[i], out / f"{i}.mp4", seed=i)) for i in range(3)]


def test_ray_gives_the_same_outputs_and_survives_a_killed_actor(local_ray, video_avatar, clips, engine, tmp_path,
                                                                tiny_checkpoints):
    from ditto_fast.batch.ray_actors import run_batch_ray

    killed = []

    def kill_first(job, handle):
        if not killed:                      # the first dispatched job loses its actor
            killed.append(job.index)
            ray.kill(handle.actor)

    from ditto_fast.avatar import store_root

    jobs = _jobs(clips, tmp_path)
    options = EngineOptions(device="cpu", checkpoints=str(tiny_checkpoints))
    stale = [tmp_path / ".ditto-fast.probe0a1b2c3d", store_root() / "avatars" / ".ditto-fast.probe4e5f6a7b"]
    for path in stale:                      # a killed driver's tokens (nobody holds their flock)
        path.write_text("0123")
    run_batch_ray(jobs, options, workers=2, report=tmp_path / "r.json", on_dispatch=kill_first)
    assert not any(path.exists() for path in stale)
    assert [j.status for j in jobs] == ["done"] * 3 and killed == [0]
    assert [j.extra["attempts"] for j in jobs] == [2, 1, 1]             # the killed actor's job was run again
    assert {j.extra["node_id"] for j in jobs} == {ray.get_runtime_context().get_node_id()}
    rows = json.loads((tmp_path / "r.json").read_text())
    assert rows["summary"] == {"done": 3, "skipped": 0, "failed": 0}
    # two actors on this node: torch in each on half its cores (Ray itself would have given them one)
    assert {r["torch_threads"] for r in rows["jobs"]} == {max(1, len(os.sched_getaffinity(0)) // 2)}
    for j in jobs:                          # the same clips as the engine's (actors may run torch on fewer
        ref = engine.render(RenderRequest("anchor", j.audio, tmp_path / f"ref{j.index}.mp4", seed=j.request.seed))   # threads: rounding)
        assert container_comment(j.output) == ref.timings["digest"]
        got, want = _frames(j.output), _frames(ref.output)
        assert got.shape == want.shape and np.abs(got.astype(int) - want).mean() < 1.0
    assert not list(tmp_path.glob(".ditto-fast.probe*")) and not list(tmp_path.glob(".*.part*"))
    # a rerun: the driver skips the finished jobs (digest by the actor's setup) before any goes to an actor, which
    # loads its networks only for a job to render; one actor alone on the node has all its cores
    jobs[1].output.unlink()
    again, sent = _jobs(clips, tmp_path), []
    run_batch_ray(again, options, workers=1, on_dispatch=lambda job, handle: sent.append(job.index))
    assert [j.status for j in again] == ["skipped", "done", "skipped"] and sent == [1]
    assert again[1].extra["torch_threads"] == len(os.sched_getaffinity(0))


def test_ray_cli_and_a_missing_ray(local_ray, video_avatar, clips, tmp_path, tiny_checkpoints, capsys,
                                   monkeypatch):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"avatar": "anchor", "audio": str(clips[0]), "output": "a.mp4"}) + "\n"
                    + json.dumps({"avatar": "ghost", "audio": str(clips[1]), "output": "b.mp4"}) + "\n")
    args = ["batch", str(jobs), "--checkpoints", str(tiny_checkpoints), "--device", "cpu", "--quiet",
            "--ray", "local"]
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 7 and capsys.readouterr().out.strip() == "done 1, skipped 0, failed 1"
    monkeypatch.setitem(sys.modules, "ray", None)          # as if Ray were not installed
    with pytest.raises(SystemExit) as e:
        main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "pip install" in err and "[ray]" in err


def test_ray_delivers_to_a_profile(local_ray, video_avatar, clips, engine, tmp_path, tiny_checkpoints):
    """A delivery job on an actor: the same file as the engine's (digest), leveled, its QC run there and reported."""
    from ditto_fast.batch.ray_actors import run_batch_ray

    jobs = [Job(0, RenderRequest("anchor", clips[0], tmp_path / "d.mxf", delivery="xdcam-hd422-1080i50", steps=2))]
    options = EngineOptions(device="cpu", checkpoints=str(tiny_checkpoints))
    run_batch_ray(jobs, options, workers=1, report=tmp_path / "r.json")
    (row,) = json.loads((tmp_path / "r.json").read_text())["jobs"]
    assert row["status"] == "done" and row["delivery"]["qc"].endswith("ok"), row
    assert abs(row["delivery"]["loudness"]["output"]["integrated_lufs"] + 23) <= 0.5
    ref = engine.render(RenderRequest("anchor", clips[0], tmp_path / "ref.mxf", delivery="xdcam-hd422-1080i50",
                                      steps=2))
    assert container_comment(tmp_path / "d.mxf") == ref.timings["digest"]


def test_ray_address_checked_and_a_cluster_that_does_not_answer(video_avatar, clips, tmp_path, tiny_checkpoints,
                                                                run_cli, monkeypatch):
    """A malformed address or a ray:// one without the Ray Client is exit 2 at once; an address where no cluster
    answers is exit 3 naming it after DITTO_FAST_RAY_TIMEOUT seconds (Ray alone retried it for ~12 minutes)."""
    import subprocess

    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"avatar": "anchor", "audio": str(clips[0]), "output": "a.mp4"}) + "\n")
    args = ["batch", str(jobs), "--checkpoints", str(tiny_checkpoints), "--device", "cpu", "--quiet", "--ray"]
    for bad in ("headnode", "head:port", "head:99999", "http://head:6379"):
        got = run_cli([*args, bad])
        assert got.returncode == 2 and f"--ray {bad}: not a Ray address" in got.stderr, got.stderr
    with monkeypatch.context() as mp:
        mp.setitem(sys.modules, "grpc", None)               # as if ray[client] were not installed
        got = run_cli([*args, "ray://head:10001"])
    assert got.returncode == 2 and "Ray Client" in got.stderr and "pip install" in got.stderr, got.stderr
    got = run_cli([*args, "127.0.0.1:1"], env={"DITTO_FAST_RAY_TIMEOUT": "soon"})
    assert got.returncode == 2 and "DITTO_FAST_RAY_TIMEOUT=soon" in got.stderr, got.stderr
    # a real process: Ray's own retries go on in a thread of it until it exits
    env = {**os.environ, "DITTO_FAST_RAY_TIMEOUT": "2"}
    done = subprocess.run([sys.executable, "-c", "from ditto_fast.cli import entry; entry()", *args, "127.0.0.1:1"],
                          env=env, capture_output=True, text=True, timeout=120)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 3 and "--ray 127.0.0.1:1" in last and "within 2 s" in last, done.stderr
    assert not (tmp_path / "a.mp4").exists() and done.stdout == ""


class NodeBlindToTheStore:
    """Mixed into the Ray engine actor by the test below: the first actors to start (as many as the store's `blind-slots`
    file says) read a token other than the driver's, as on a node that mounts another store at that path."""

    def __init__(self, options, store, probes, share=None, wire=None):
        from pathlib import Path

        slots = Path(store) / "blind-slots"
        for k in range(int(slots.read_text()) if slots.exists() else 0):
            try:
                os.close(os.open(slots.parent / f"blind-{k}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                continue
            probes = {path: "another store's token" for path in probes}
            break
        super().__init__(options, store, probes, share, wire)


def test_an_actor_whose_node_cannot_see_the_store_says_why(local_ray, video_avatar, clips, tmp_path,
                                                           tiny_checkpoints, monkeypatch):
    """The start-up check's reason reaches the driver (Ray 2.x turns an actor constructor's exception into a bare
    ActorDiedError): one blind node of two is a warning naming it and a row in the report, and its would-be jobs
    run on the other; all nodes blind fail every job with the reason (exit 3 each), not "no Ray actor is left"."""
    from ditto_fast.avatar import store_root
    from ditto_fast.batch import ray_actors
    from ditto_fast.handles import ray_engine

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])    # the actors get the class itself
    monkeypatch.setattr(ray_engine, "EngineActor", type("BlindActor", (NodeBlindToTheStore, ray_engine.EngineActor),
                                                        {}))
    options = EngineOptions(device="cpu", checkpoints=str(tiny_checkpoints))
    store = store_root()
    try:
        for blind, outcome in ((1, ["done"] * 3), (2, ["failed"] * 3)):
            (store / "blind-slots").write_text(str(blind))
            for old in store.glob("blind-[0-9]*"):
                old.unlink()
            warnings: list[str] = []
            jobs = _jobs(clips, tmp_path / f"blind{blind}")
            (tmp_path / f"blind{blind}").mkdir()
            run_batch_ray = ray_actors.run_batch_ray
            run_batch_ray(jobs, options, workers=2, report=tmp_path / f"r{blind}.json", warn=warnings.append)
            assert [j.status for j in jobs] == outcome, [j.error for j in jobs]
            report = json.loads((tmp_path / f"r{blind}.json").read_text())
            (node,) = report["ray_nodes"]             # two actors on this machine's one node
            assert node["node"] and node["node_id"] == ray.get_runtime_context().get_node_id()
            assert "not visible from Ray node" in node["error"] and node["actors"] == 2 - blind
            assert len(warnings) == 1 and "not visible from Ray node" in warnings[0] and node["node_id"][:12] in \
                warnings[0]
            if blind == 2:
                assert all("not visible from Ray node" in j.error and j.exit_code == 3 for j in jobs)
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        for f in [store / "blind-slots", *store.glob("blind-[0-9]*")]:
            f.unlink(missing_ok=True)


CRASH_ONCE = """
import os
import sys

from ditto_fast.handles import ray_engine
from ditto_fast.cli import entry


class CrashOnce(ray_engine.EngineActor):
    \"\"\"The worker process of the first job to start dies (as by the OOM killer, or a segfault).\"\"\"

    marker = sys.argv.pop(1)            # travels with the class to the actors

    def engine_for(self, start, tell):
        engine = super().engine_for(start, tell)
        outcome, marker = engine.outcome, self.marker

        def crash_once(job, *args):
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return outcome(job, *args)
            os._exit(1)
        engine.outcome = crash_once
        return engine


ray_engine.EngineActor = CrashOnce
entry()
"""


def test_a_worker_that_dies_leaves_stdout_to_the_summary(video_avatar, clips, tmp_path, tiny_checkpoints):
    """A worker process that dies mid-job: Ray's raylet says so with a print() on the driver's stdout, which is the
    batch's summary's alone; the job runs again on the other actor."""
    import subprocess

    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("".join(json.dumps({"avatar": "anchor", "audio": str(c), "output": f"{i}.mp4"}) + "\n"
                            for i, c in enumerate(clips)))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    marker = tmp_path / "crashed"
    done = subprocess.run([sys.executable, "-c", CRASH_ONCE, str(marker), "batch", str(jobs), "--checkpoints",
                           str(tiny_checkpoints), "--device", "cpu", "--quiet", "--ray", "local", "--workers", "2",
                           "--report", str(tmp_path / "r.json")], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout == "done 3, skipped 0, failed 0\n", (done.stdout, done.stderr)
    assert marker.exists()
    rows = json.loads((tmp_path / "r.json").read_text())["jobs"]       # the job that lost its worker says so
    assert sorted(r["attempts"] for r in rows) == [1, 1, 2]
    assert all(re.fullmatch("[0-9a-f]{56}", r["node_id"]) and r["node"] for r in rows)


def test_a_folder_the_token_cannot_be_written_in_is_named(tmp_path):
    """No internal error when the driver cannot write a visibility token: the folder, and nothing left behind."""
    from ditto_fast.handles.ray_engine import probe_folders
    from ditto_fast.core.errors import InputError

    (tmp_path / "out").mkdir()
    (tmp_path / "store").write_text("a file where the store's folder should be")
    with pytest.raises(InputError, match="store: cannot write the token"):
        probe_folders([tmp_path / "out", tmp_path / "store"])
    assert os.listdir(tmp_path / "out") == []


def test_the_actor_plan_follows_workers_nodes_and_jobs(local_ray):
    """One node of 2 CPUs, no GPU: one actor by default, --workers N many sharing its cores, never more than the
    jobs to render (none: no actor)."""
    from ditto_fast.handles.ray_engine import plan_actors

    cpu = {"num_cpus": 1, "scheduling_strategy": "SPREAD"}
    assert plan_actors(ray, "auto", None) == (1, 1, cpu)
    assert plan_actors(ray, "cpu", 3) == (3, 3, cpu)
    assert plan_actors(ray, "auto", 3, most=2) == (2, 2, cpu)
    assert plan_actors(ray, "auto", None, most=0)[0] == 0
