"""Splitting one dataset across jobs: pure functions of (sample id, num_jobs, job_index)."""

from typing import Iterable, List


def owns(sample_id: int, num_jobs: int, job_index: int) -> bool:
    """Job `job_index` of `num_jobs` owns the ids congruent to it modulo `num_jobs`
    (round robin, so long and short conversations spread evenly)."""
    return sample_id % num_jobs == job_index


def job_ids(ids: Iterable[int], num_jobs: int, job_index: int) -> List[int]:
    return [i for i in ids if owns(i, num_jobs, job_index)]


def writer_tag(num_jobs: int, job_index: int) -> str:
    """Shard-name prefix that keeps jobs' shard files apart ('' for a single job)."""
    return "" if num_jobs == 1 else f"j{job_index:04d}"
