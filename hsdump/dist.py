"""Splitting one dataset across jobs: pure functions of (sample id, num_jobs, job_index).

A job is one hsdump process with its own SGLang engine: a SLURM job on a node, a Ray task,
or one of several engines on one node. `dist.num_jobs` and `dist.job_index` say which part is
this job's; every job writes into the same output directory (docs/format.md): each owns a
disjoint set of sample ids (`owns`), and writes its shards and its commit log under its own
name (`writer_tag`), so jobs never share a file and the reader sees one dataset, the union of
the logs. Sample ids stay the input row numbers, whatever the split.

Nothing here depends on how the jobs are launched; see conf/hydra/launcher/ for the presets.
"""

from typing import Dict, Iterable, List

from hsdump.errors import Refusal


def check(num_jobs: int, job_index: int) -> None:
    """Raise ValueError unless 0 <= job_index < num_jobs."""
    if int(num_jobs) != num_jobs or int(job_index) != job_index:
        raise Refusal(f"dist.num_jobs={num_jobs!r}, dist.job_index={job_index!r}: integers")
    if num_jobs < 1 or not 0 <= job_index < num_jobs:
        raise Refusal(
            f"dist.job_index={job_index} with dist.num_jobs={num_jobs}: need "
            "num_jobs >= 1 and 0 <= job_index < num_jobs"
        )


def owner(sample_id: int, num_jobs: int) -> int:
    """The job index that owns `sample_id` (round robin over the row numbers, so long and
    short conversations, often clustered in a file, spread evenly over the jobs)."""
    if sample_id < 0:
        raise Refusal(f"sample id {sample_id}: ids are row numbers, >= 0")
    return sample_id % num_jobs


def owns(sample_id: int, num_jobs: int, job_index: int) -> bool:
    """Job `job_index` of `num_jobs` owns the ids congruent to it modulo `num_jobs`."""
    return owner(sample_id, num_jobs) == job_index


def job_ids(ids: Iterable[int], num_jobs: int, job_index: int) -> List[int]:
    """The ids of `ids` that job `job_index` owns, in their input order."""
    check(num_jobs, job_index)
    return [i for i in ids if owns(i, num_jobs, job_index)]


def split(ids: Iterable[int], num_jobs: int) -> Dict[int, List[int]]:
    """All jobs' parts at once: {job_index: ids}, every job present (maybe empty)."""
    check(num_jobs, 0)
    parts: Dict[int, List[int]] = {j: [] for j in range(num_jobs)}
    for i in ids:
        parts[owner(i, num_jobs)].append(i)
    return parts


def writer_tag(num_jobs: int, job_index: int) -> str:
    """A job's writer name: '' for a single job (written as `main`: commits/main.jsonl,
    shards/main/...), else 'j0001of0004' (commits/j0001of0004.jsonl, shards/j0001of0004/...).

    The tag names both numbers, so jobs of two different splits of one directory (a run
    re-split from 4 jobs into 8, say) never write the same file; a re-run of the same job
    resumes its own log and continues its numbering after the shards that log commits."""
    check(num_jobs, job_index)
    if num_jobs == 1:
        return ""
    width = max(4, len(str(num_jobs - 1)))
    return f"j{job_index:0{width}d}of{num_jobs:0{width}d}"
