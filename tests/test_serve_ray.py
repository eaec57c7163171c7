"""serve --ray: joining the tests' Ray cluster, served bytes equal to render's, a cancel and a lost actor (on their own
file: scripts/test.sh's workers run the *_ray.py files on one worker, beside one cluster)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from conftest import store_env  # noqa: E402
from support import Server, speech_clip, wait_for_frames  # noqa: E402


@pytest.mark.slow
def test_serve_on_ray_renders_render_s_bytes_cancels_and_survives_a_lost_actor(local_ray, serving, tmp_path, run_cli,
                                                                                tiny_checkpoints):
    """`serve --ray ADDRESS` joining the tests' cluster: one actor, loaded before the server listens."""
    ray = local_ray
    server = serving("--ray", ray.get_runtime_context().gcs_address, "--workers", "1")
    (engine,) = server.call("GET", "/healthz")[1]["engines"]
    assert engine["kind"] == "ray" and engine["state"] == "idle"
    assert ray.get_runtime_context().get_node_id()[:12] in engine["where"]
    audio = speech_clip(tmp_path, "a.wav", 0.8)
    job = server.wait(server.call("POST", "/v1/jobs", {"avatar": "anchor", "audio": str(audio), "seed": 3,
                                                       "output": str(tmp_path / "served.mp4")})[1]["id"])
    assert job["status"] == "done" and job["timings"]["frames"] == 20, job
    r = run_cli(["render", "--avatar", "anchor", "--audio", audio, "-o", tmp_path / "rendered.mp4", "--seed", "3",
                 "--device", "cpu", "--quiet"], store_env(tmp_path / "home", tiny_checkpoints))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "served.mp4").read_bytes() == (tmp_path / "rendered.mp4").read_bytes()

    long = speech_clip(tmp_path, "long.wav", 4.0)
    victim = server.call("POST", "/v1/jobs", {"avatar": "anchor", "audio": str(long),
                                              "output": str(tmp_path / "victim.mp4")})[1]["id"]
    wait_for_frames(server, victim)
    assert server.call("DELETE", f"/v1/jobs/{victim}")[0] == 202
    assert server.wait(victim)["status"] == "cancelled"
    assert not [p for p in tmp_path.iterdir() if "victim" in p.name]     # nor its part file

    lost = server.call("POST", "/v1/jobs", {"avatar": "anchor", "audio": str(long),
                                            "output": str(tmp_path / "lost.mp4")})[1]["id"]
    wait_for_frames(server, lost)
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["namespace"] == "ditto-fast" and a["name"].startswith(f"ditto-fast-serve-{server.proc.pid}-")]
    assert len(names) == 1
    ray.kill(ray.get_actor(names[0], namespace="ditto-fast"))         # its node lost, say
    again = server.wait(lost)
    assert again["status"] == "done" and again["attempts"] == 2, again     # on the actor started in its place
    assert server.stop() == 0
    assert not [a for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == "ditto-fast"]
    # a server started before any avatar is registered (its store not made yet) starts all the same
    fresh = Server(store_env(tmp_path / "fresh", tiny_checkpoints), tmp_path, "--ray",
                   ray.get_runtime_context().gcs_address, "--workers", "1")
    try:
        assert len(fresh.start().call("GET", "/healthz")[1]["engines"]) == 1
    finally:
        assert fresh.stop() == 0
