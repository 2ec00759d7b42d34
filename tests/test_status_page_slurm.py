"""The controller's status page on the real local cluster (slurmctld + 4 slurmd, 8 fake GPUs each;
tests/conftest.py ``live_cluster``): loaded in headless Chromium, its node x GPU map is Slurm's
(``squeue``'s per-node GPUs of running jobs, ``sinfo``'s free GPUs) and the job that does not fit
is in its queue with its reason."""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import pytest

from controller.config import load_config
from controller.daemon import Controller
from test_status_page import CHROMIUM, _dump_dom, _info_logs, _MapDom  # noqa: F401 - _info_logs: autouse

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(300)]


def test_status_page_map_is_slurms_on_the_live_cluster(live_cluster, test_user, tmp_path):
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (scripts/setup.sh installs it)")
    cluster = live_cluster
    ids = []
    for g, m in ((8, "MoE"), (12, "LM"), (4, "GNN"), (16, "MoE")):
        # each in its own second: FIFO breaks ties of Slurm's 1 s submit times by job id as text, which is
        # submission order only among ids of one width (job 10 would go before job 9)
        time.sleep(1.0 - time.time() % 1.0)
        ids.append(cluster.sbatch("sleep 60", g, comment=f"rlsched:model={m},samples=100000", user=test_user))
    ctl = Controller(load_config(cluster.controller_config(tmp_path, policy="fifo")))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctl.metrics.serve(port, "127.0.0.1", controller=ctl)
    try:
        rep = ctl.round()
        assert rep.ok, rep.error
        assert sorted(j for j, _ in rep.placed) == sorted(ids[:3])  # 24 of 32 GPUs; 16 more do not fit
        cluster.wait(lambda: all(cluster.job(j).state == "RUNNING" for j in ids[:3]), 30, "placed jobs to start")
        assert ctl.round().ok  # reads them running
        token = ctl.metrics.status_page.token
        dom = _dump_dom(f"http://rlsched:{token}@127.0.0.1:{port}/status", tmp_path / "chromium")
        p = _MapDom()
        p.feed(dom)
        slurm = cluster.slurm()
        nodes = slurm.nodes()
        want: dict[str, dict[str, int]] = {n.name: {} for n in nodes if "gpu" in n.partitions}
        for j in slurm.jobs():
            if j.state == "RUNNING":
                for node, g in j.gpus_per_node.items():
                    want[node][str(j.job_id)] = g
        assert p.map == want
        assert p.free == {n.name: n.gpus - n.gpus_used for n in nodes if "gpu" in n.partitions}
        assert p.queue == [str(ids[3])]
        req = urllib.request.Request(f"http://127.0.0.1:{port}/status.json",
                                     headers={"Authorization": f"Bearer {token}"})
        doc = json.loads(urllib.request.urlopen(req, timeout=10).read())
        (q,) = doc["queue"]
        assert q["reason"] == "waiting for placement by fifo: position 1 of 1" and q["user"] == test_user
        placed = [a for r in doc["rounds"] for a in r["actions"] if a["action"] == "placed"]
        assert sorted(int(a["job"]) for a in placed) == sorted(ids[:3])
    finally:
        ctl.metrics.server.shutdown()
        ctl.metrics.server.server_close()
        ctl.metrics.status_page.close()
