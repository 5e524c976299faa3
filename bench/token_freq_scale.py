"""Cost of counting a regenerated dataset's token_freq.json at a job's end (stats.write_committed_token_freq).

Writes N samples of 256 tokens (hidden 4, about 10 samples per shard) with DatasetWriter, then
times the recount over every committed sample. It grows with the whole dataset, once per job:
    python3 bench/token_freq_scale.py 20000
"""
import time, torch, sys, tempfile
from hsdump.writer import DatasetWriter
from hsdump.stats import write_committed_token_freq
n = int(sys.argv[1]); d = tempfile.mkdtemp(prefix="hsdump-tf-")
w = DatasetWriter(d, {"format": "hsdump/speculators-v1", "layers": [1]}, {"k": 1}, layers=[1], hidden_size=4, shard_bytes=30000)
g = torch.Generator().manual_seed(0)
t = time.time()
for sid in range(n):
    ids = torch.randint(0, 30000, (256,), generator=g).tolist()
    w.add(sid, ids, [0]*128 + [1]*128, [torch.zeros(256, 4)])
w.close(commit=True); print("write", time.time()-t)
t = time.time(); write_committed_token_freq(d, 32000); dt = time.time()-t
print(f"{n} samples: count {dt:.2f} s, {dt/n*1e6:.1f} us/sample -> 1M: {dt/n*1e6:.0f} s")
