"""vlad's flight recording (MCAP, docs/observability.md) as the report and the checks read
it: per inference the observation vlad took (state, frames), the chunk, its latency; per
tick what was published."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class Inference:
    obs_seq: int
    state: np.ndarray
    frames: dict = field(default_factory=dict)  # camera index -> [H, W, 3]
    instruction_id: int = 0
    chunk_id: int = 0
    ok: bool = False
    latency_ms: float = 0.0
    actions: np.ndarray | None = None
    seed: int = 0


@dataclass
class Recording:
    path: Path
    inferences: list
    ticks: list  # (decision, status, chunk_id, step)
    metadata: dict


def read_all(paths: list) -> Recording:
    """Several recordings of one run (each covers the last `history_s`) as one: inferences
    by observation and chunk, each once; ticks of the last."""
    recs = [read(p) for p in paths]
    seen, inferences = set(), []
    for r in recs:
        for inf in r.inferences:
            if (inf.obs_seq, inf.chunk_id) not in seen:
                seen.add((inf.obs_seq, inf.chunk_id))
                inferences.append(inf)
    inferences.sort(key=lambda i: i.obs_seq)
    return Recording(recs[-1].path, inferences, recs[-1].ticks, recs[-1].metadata)


def read(path: Path) -> Recording:
    from mcap.reader import make_reader
    by_seq: dict[int, Inference] = {}
    ticks = []
    metadata = {}
    with Path(path).open("rb") as f:
        reader = make_reader(f)
        for m in reader.iter_metadata():
            metadata[m.name] = dict(m.metadata)
        pending: dict[int, dict] = {}
        for _schema, channel, message in reader.iter_messages(log_time_order=False):
            body = json.loads(message.data)
            topic = channel.topic
            if topic == "/vla/observation":
                inf = pending.setdefault(message.sequence, {})
                inf["obs"] = body
            elif topic.startswith("/vla/camera/"):
                cam = int(topic.rsplit("/", 1)[1])
                img = np.frombuffer(base64.b64decode(body["data"]), np.uint8).reshape(body["height"], body["width"], 3)
                pending.setdefault(message.sequence, {}).setdefault("frames", {})[cam] = img
            elif topic == "/vla/chunk":
                pending.setdefault(message.sequence, {})["chunk"] = body
            elif topic == "/vla/action":
                ticks.append((body["decision"], body["status"], body["chunk_id"], body["step"]))
    inferences = []
    for seq in sorted(pending):
        p = pending[seq]
        if "obs" not in p:
            continue
        o, c = p["obs"], p.get("chunk", {})
        inf = Inference(obs_seq=o["seq"], state=np.array(o["state"], np.float32), frames=p.get("frames", {}), instruction_id=int(o["instruction_id"]),
                        chunk_id=o["chunk_id"], ok=bool(c.get("ok")), latency_ms=float(c.get("latency_ms", {})
                                                                                       .get("total", 0.0)),
                        actions=np.array(c["actions"], np.float32) if c.get("actions") else None,
                        seed=int(o.get("seed", 0)))
        by_seq[seq] = inf
        inferences.append(inf)
    return Recording(Path(path), inferences, ticks, metadata)
