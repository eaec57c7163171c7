"""Registration benchmark: per-frame stage times at 1080p, avatar load time, peak RSS for 200 vs 400 frames."""

from __future__ import annotations

import tempfile

from bench_common import anchor, checkpoints, run_child, save

CHILD = """
import json, resource, time
from ditto_fast.avatar.register import register_avatar
from ditto_fast.avatar import load_avatar
from ditto_fast.core.timing import StageTimer
t = StageTimer()
t0 = time.perf_counter()
d = register_avatar({video!r}, name="bench", force=True, checkpoints={ckpt!r}, device="cpu", timer=t)
wall = time.perf_counter() - t0
loads = []
for _ in range(5):
    a = time.perf_counter(); av = load_avatar(d); loads.append(time.perf_counter() - a)
kids = resource.getrusage(resource.RUSAGE_CHILDREN)      # ffmpeg: the decode + plate process and two short probes
print(json.dumps({{"wall": wall, "frames": av.n_frames, "stages": dict(t.seconds), "cpu": dict(t.cpu_seconds),
                  "ffmpeg_cpu": kids.ru_utime + kids.ru_stime, "ffmpeg_rss_mib": kids.ru_maxrss / 1024,
                  "load_s": min(loads)}}))
"""


def run(out_json: str | None, quick: bool = False, tiny: bool | None = None) -> dict:
    """Register synthetic 1080p anchors of two lengths in child processes; print and return the figures."""
    tiny = quick if tiny is None else tiny
    ckpt = checkpoints(tiny, networks=("appearance_extractor", "motion_extractor"), hubert=False)
    lengths = (50, 100) if quick else (200, 400)
    result = {"networks": "tiny" if tiny else "full", "size": "1920x1080", "runs": {}}
    for n in lengths:
        video = anchor(n)
        with tempfile.TemporaryDirectory() as home:
            stats, rss = run_child(CHILD.format(video=str(video), ckpt=str(ckpt)), {"DITTO_FAST_HOME": home})
        per = {k: 1000 * v / stats["frames"] for k, v in stats["stages"].items()}
        cpu = {k: 1000 * v / stats["frames"] for k, v in stats["cpu"].items()}
        non_net = sum(v for k, v in per.items() if k != "networks")
        non_net_cpu = sum(v for k, v in cpu.items() if k != "networks")
        # the whole call (start-up, model loading, waiting for ffmpeg at the end) minus the networks
        wall_non_net = (1000 * stats["wall"] - per.get("networks", 0) * stats["frames"]) / stats["frames"]
        result["runs"][n] = {"frames": stats["frames"], "wall_s": stats["wall"], "ms_per_frame": per,
                             "non_network_ms_per_frame": non_net, "cpu_ms_per_frame": cpu,
                             "non_network_cpu_ms_per_frame": non_net_cpu,
                             "ffmpeg_cpu_ms_per_frame": 1000 * stats["ffmpeg_cpu"] / stats["frames"],
                             "ffmpeg_peak_rss_mib": stats["ffmpeg_rss_mib"],
                             "wall_minus_networks_ms_per_frame": wall_non_net, "avatar_load_s": stats["load_s"],
                             "peak_rss_mib": rss}
    a, b = (result["runs"][n] for n in lengths)
    result["rss_growth"] = b["peak_rss_mib"] / a["peak_rss_mib"] - 1
    print(f"{'frames':>7} {'decode':>7} {'landmk':>7} {'crop+eye':>8} {'plate':>7} {'cache':>7} {'nets':>8} "
          f"{'non-net':>8} {'wall-net':>8} {'cpu':>6} {'ffmpeg':>6} {'load s':>7} {'RSS MiB':>8}"
          f"   (ms/frame; {result['networks']} networks)")
    for n, r in result["runs"].items():
        p = r["ms_per_frame"]
        print(f"{n:>7} {p.get('decode', 0):7.1f} {p.get('landmarks', 0):7.1f} {p.get('crop_eyes', 0):8.1f} "
              f"{p.get('plate_write', 0):7.1f} {p.get('cache_write', 0):7.1f} {p.get('networks', 0):8.1f} "
              f"{r['non_network_ms_per_frame']:8.1f} {r['wall_minus_networks_ms_per_frame']:8.1f} "
              f"{r['non_network_cpu_ms_per_frame']:6.1f} {r['ffmpeg_cpu_ms_per_frame']:6.1f} "
              f"{r['avatar_load_s']:7.3f} {r['peak_rss_mib']:8.0f}")
    print("non-net: the stages other than the networks (target <= 25 ms/frame); wall-net: the whole call's wall time\n"
          "less the networks, start-up and the plate encoder's tail included; cpu: this process's CPU time in the\n"
          "non-net stages (all threads); ffmpeg: the CPU time of the ffmpeg process (decode + plate encode)")
    print(f"peak RSS {lengths[1]} vs {lengths[0]} frames: {100 * result['rss_growth']:+.1f}% (target within 15%); "
          f"ffmpeg's own peak RSS {a['ffmpeg_peak_rss_mib']:.0f} / {b['ffmpeg_peak_rss_mib']:.0f} MiB")
    return save(out_json, result)
