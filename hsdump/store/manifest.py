"""manifest.json in one place: built (`Manifest`, `ResumeKey`), written (`write`, by the writer;
`upgrade` for a version 1 dataset resumed, `replan` for a resumed run's own plan), read and validated (`Manifest.read`, `read`,
`problems`, `check_manifest`: the one validator of the loader and `hsdump verify`), and what it
says about completeness (`progress`, `Progress`). The JSON is docs/format.md's "manifest.json" and
docs/schema/manifest.schema.json; manifests of older versions read as they are.

Two builders: an extraction fills every field (`hsdump.pipeline` builds it from the run);
`Manifest.for_rows` is the manifest of rows that come from no dataset source (benchmarks,
tests): model facts, layers, dtypes and a resume key of those alone.

    m = Manifest.for_rows(model="m", hidden_size=64, num_hidden_layers=4, layers=[1, 2])
    DatasetWriter(out, m)

No torch import: `hsdump verify` and `hsdump inspect` validate a manifest without loading it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from hsdump import __version__
from hsdump.errors import Refusal
from hsdump.store.layout import (
    FINAL_KINDS,
    FORMAT,
    MANIFEST,
    MAX_LAYERS,
    STORAGE,
    SUPPORTED_VERSIONS,
    VERSION,
)

CONVENTION = "hf_hidden_states_index"
"""The layer-index convention every manifest names (docs/format.md)."""
ENGINES = ("sglang", "dry")
"""What wrote the rows: SGLang, or engine=dry (a function of the token ids)."""
FP8_NAMES = ("fp8", "float8_e4m3fn", "fp8_e4m3")
"""storage_dtype spellings of per-token scaled e4m3 rows (hsdump.store.fp8.STORAGE_ALIASES)."""
STORAGE_NAMES = tuple(sorted(set(STORAGE) | set(STORAGE.values()) | set(FP8_NAMES)))
"""Every storage_dtype a manifest may name."""
HIDDEN_LIMIT = 1 << 24
PACKAGES = ("sglang", "torch", "transformers", "datasets", "safetensors")


def versions() -> Dict[str, str]:
    """The installed versions of hsdump and the packages a run depends on ('absent' for one
    not installed), read from the package metadata (nothing is imported)."""
    from importlib import metadata

    out = {"hsdump": __version__}
    for pkg in PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "absent"
    return out


def _omit_none(d: Dict[str, Any], keys: Sequence[str]) -> Dict[str, Any]:
    return {k: v for k, v in d.items() if not (k in keys and v is None)}


# ------------------------------------------------------------------------ the run key
@dataclass(frozen=True)
class ResumeKey:
    """What a run resuming into a folder must agree on, key by key (`manifest["resume_key"]`).
    An extraction sets every field; rows from no dataset source (`Manifest.for_rows`) leave the
    source's fields None, and None fields are left out of the JSON, as `regenerate` (only with
    regenerated answers) and `engine` (only `dry`) are."""

    model: str
    hidden_size: int
    num_hidden_layers: int
    layers: List[int]
    final: List[str]
    storage_dtype: str
    architecture: Optional[str] = None
    model_dtype: Optional[str] = None
    tokenizer: Optional[str] = None
    chat_template_sha256: Optional[str] = None
    dataset: Optional[list] = None
    """[the rows' content fingerprint]; datasets written before 2026-12-02 keep
    [path, name, split, revision, column]."""
    max_seq_len: Optional[int] = None
    truncation: Optional[str] = None
    min_seq_len: Optional[int] = None
    format: Optional[str] = None
    regenerate: Optional[dict] = None
    engine: Optional[str] = None
    """'dry' for engine=dry (a real run never resumes into it), else None (left out)."""

    def to_json(self) -> Dict[str, Any]:
        d = dataclasses.asdict(self)
        return {k: v for k, v in d.items() if v is not None}

    def diff(self, old: Any) -> List[str]:
        """Keys that differ from the resume key `old` (a folder's `manifest["resume_key"]`, any
        JSON), as 'key: old -> new' lines, with why where the key alone does not say it."""
        old = old if isinstance(old, dict) else {}
        new = self.to_json()
        return [
            f"{k}: {old.get(k)!r} -> {new.get(k)!r}" + (f" ({_WHY[k]})" if k in _WHY else "")
            for k in sorted(set(old) | set(new))
            if old.get(k) != new.get(k)
        ]


_WHY = {
    "dataset": "the source rows' content is not the same: the file was edited, or it is "
    "another file; restore the one the dataset was made from",
    "engine": "engine=dry rows and a real engine's never mix in one dataset",
}


# ------------------------------------------------------------------------ the manifest
@dataclass(frozen=True)
class ModelFacts:
    """`manifest["model"]`. `family` and `verified` are null for a class hsdump never verified
    (captured with capture.allow_unverified=true)."""

    path: str
    hidden_size: int
    num_hidden_layers: int
    architecture: Optional[str] = None
    resolved_path: Optional[str] = None
    dtype: Optional[str] = None
    """the dtype the engine ran the model in"""
    tp_size: Optional[int] = None
    family: Optional[str] = None
    verified: Optional[str] = None


@dataclass(frozen=True)
class Source:
    """What an extraction records of its source and its length policy: the manifest's
    `tokenizer`, `dataset`, `max_seq_len`, `truncation`, `tokenized`, `regenerate` and `config`
    (absent for rows from no dataset source)."""

    tokenizer: Dict[str, Any]
    dataset: Dict[str, Any]
    max_seq_len: int
    truncation: str
    tokenized: Dict[str, Any]
    config: Dict[str, Any]
    regenerate: Optional[Dict[str, Any]] = None


@dataclass(frozen=True)
class Manifest:
    """manifest.json, typed. `to_json()` is the file's object; `Manifest.read(d)` the other way.

    `planned`: how many samples the run meant to write, all jobs' together (the samples
    tokenization kept); None where unknown (rows from no source, manifests written before
    2026-12-03, which say it as `tokenized.samples`). `kinds`: the drafter kinds the capture
    serves and each layer's meaning (docs/format.md), None (left out) when not recorded."""

    model: ModelFacts
    layers: List[int]
    resume_key: ResumeKey
    storage_dtype: str = "bfloat16"
    final: List[str] = field(default_factory=list)
    engine: str = "sglang"
    source: Optional[Source] = None
    planned: Optional[int] = None
    kinds: Optional[Dict[str, Any]] = None
    versions: Dict[str, str] = field(default_factory=versions)
    format_version: int = VERSION

    @classmethod
    def for_rows(
        cls,
        *,
        model: str,
        hidden_size: int,
        num_hidden_layers: int,
        layers: Sequence[int],
        storage_dtype: str = "bfloat16",
        final: Sequence[str] = (),
        architecture: Optional[str] = None,
        model_dtype: Optional[str] = None,
        engine: str = "sglang",
        planned: Optional[int] = None,
    ) -> "Manifest":
        """The manifest of rows from no dataset source (a benchmark's token ids, a test's
        tensors): model facts, layers and dtypes; its resume key holds those alone."""
        layers, final = [int(x) for x in layers], list(final)
        key = ResumeKey(
            model=model,
            hidden_size=hidden_size,
            num_hidden_layers=num_hidden_layers,
            layers=layers,
            final=final,
            storage_dtype=storage_dtype,
            architecture=architecture,
            model_dtype=model_dtype,
            engine="dry" if engine == "dry" else None,
        )
        m = cls(
            model=ModelFacts(
                path=model,
                hidden_size=hidden_size,
                num_hidden_layers=num_hidden_layers,
                architecture=architecture,
                dtype=model_dtype,
            ),
            layers=layers,
            resume_key=key,
            storage_dtype=storage_dtype,
            final=final,
            engine=engine,
            planned=planned,
        )
        m.check()
        return m

    def check(self) -> None:
        """Raise ValueError naming the first problem of this manifest (before it is written)."""
        bad = problems(self.to_json())
        if bad:
            raise Refusal(f"manifest: {bad[0]}")

    def to_json(self) -> Dict[str, Any]:
        """The object manifest.json holds (the writer adds nothing)."""
        out: Dict[str, Any] = {
            "format": FORMAT,
            "format_version": self.format_version,
            "engine": self.engine,
            "versions": dict(self.versions),
            "hsdump_version": self.versions.get("hsdump", __version__),
            "sglang_version": self.versions.get("sglang", "absent"),
            "model": dataclasses.asdict(self.model),
            "layers": list(self.layers),
            "convention": CONVENTION,
            "storage_dtype": self.storage_dtype,
            "final": list(self.final),
            "final_names": {k: "{i}/final/" + k for k in self.final},
            "resume_key": self.resume_key.to_json(),
        }
        if self.source is not None:
            out.update(dataclasses.asdict(self.source))
        return _omit_none({**out, "planned": self.planned, "kinds": self.kinds}, PLAIN_OPTIONAL)

    @classmethod
    def read(cls, d) -> "Manifest":
        """The manifest of dataset folder `d` (read as hsdump.store.commits.read_manifest
        does), validated: a ValueError names the first problem."""
        return cls.from_json(read(d), where=Path(d))

    @classmethod
    def from_json(cls, m: Any, where: Any = "manifest.json") -> "Manifest":
        """A Manifest from a manifest.json object of any version (fields an older version
        lacks are None). Raises ValueError naming the first problem (`problems`)."""
        check_manifest(where, m)
        model = m["model"]
        mf = ModelFacts(
            **{f.name: model.get(f.name) for f in dataclasses.fields(ModelFacts)},
        )
        rk = m.get("resume_key") if isinstance(m.get("resume_key"), dict) else {}
        names = {f.name for f in dataclasses.fields(ResumeKey)}
        key = ResumeKey(
            **{
                "model": mf.path,
                "hidden_size": mf.hidden_size,
                "num_hidden_layers": mf.num_hidden_layers,
                "layers": list(m["layers"]),
                "final": list(m.get("final") or []),
                "storage_dtype": m["storage_dtype"],
                **{k: v for k, v in rk.items() if k in names},
            }
        )
        src = None
        if all(k in m for k in SOURCE_KEYS):
            src = Source(**{k: m[k] for k in SOURCE_KEYS}, regenerate=m.get("regenerate"))
        vers = m.get("versions") if isinstance(m.get("versions"), dict) else {}
        return cls(
            model=mf,
            layers=list(m["layers"]),
            resume_key=key,
            storage_dtype=m["storage_dtype"],
            final=list(m.get("final") or []),
            engine=m.get("engine") or "sglang",
            source=src,
            planned=planned_of(m),
            kinds=m.get("kinds"),
            versions={str(k): str(v) for k, v in vers.items()},
            format_version=m["format_version"],
        )


PLAIN_OPTIONAL = ("planned", "kinds")
"""Top-level keys left out of manifest.json when unknown."""
SOURCE_KEYS = ("tokenizer", "dataset", "max_seq_len", "truncation", "tokenized", "config")


# ------------------------------------------------------------------------ writing
def write(d, m: Manifest) -> None:
    """Write `m` as folder `d`'s manifest.json (atomically: a temporary file, then renamed)."""
    from hsdump.store.files import write_json

    write_json(Path(d) / MANIFEST, m.to_json())


def upgrade(d, old: Dict[str, Any], version: int = VERSION) -> None:
    """Rewrite folder `d`'s manifest.json object `old` (an older version's, read as it is) with
    `format_version` set to `version`, every other key kept: a version 1 dataset resumed."""
    from hsdump.store.files import write_json

    write_json(Path(d) / MANIFEST, {**old, "format_version": version})


def replan(d, old: Dict[str, Any], planned: Optional[int]) -> None:
    """Set `planned` in folder `d`'s manifest.json object `old` when a resumed run plans
    another number of samples (a larger or smaller dataset.max_samples, which the resume key
    allows): the one key rewritten on resume, so that completeness is judged against what the
    latest run meant to write."""
    if planned is None or old.get("planned") == planned:
        return
    from hsdump.store.files import write_json

    write_json(Path(d) / MANIFEST, {**old, "planned": planned})


# ------------------------------------------------------------------------ reading, checking
def read(d) -> Dict[str, Any]:
    """manifest.json of folder `d` as an object (a regular file inside `d`, bounded), not
    validated: FileNotFoundError without one, ValueError for one that does not parse."""
    from hsdump.store.commits import read_manifest

    return read_manifest(Path(d))


def _short(x, n: int = 80) -> str:
    t = repr(x)
    return t if len(t) <= n else t[:n] + f"... ({len(t):,} characters)"


def problems(m: Any) -> List[str]:
    """Every problem of a manifest.json object that a reader of the dataset relies on, one
    line each ('model.hidden_size is None, not a positive int'); [] when usable. The one
    validator: the reader (`check_manifest`) stops at the first, `hsdump verify` reports them all."""
    if not isinstance(m, dict):
        return [f"holds a JSON {type(m).__name__}, not an object"]
    out = []
    if m.get("format") != FORMAT:
        out.append(f"format is {_short(m.get('format'))}, expected {FORMAT!r}")
    if m.get("format_version") not in SUPPORTED_VERSIONS:
        out.append(
            f"format_version is {_short(m.get('format_version'))}; this reader knows "
            f"{list(SUPPORTED_VERSIONS)}"
        )
    layers = m.get("layers")
    if not (
        isinstance(layers, list)
        and 0 < len(layers) <= MAX_LAYERS
        and all(type(x) is int and 0 <= x < MAX_LAYERS for x in layers)
        and len(set(layers)) == len(layers)
    ):
        out.append(
            f"layers is {_short(layers)}, not a list of 1 to {MAX_LAYERS} distinct layer indices"
        )
    model = m.get("model")
    hidden = model.get("hidden_size") if isinstance(model, dict) else None
    if not isinstance(model, dict):
        out.append(f"model is {_short(model)}, not an object")
    elif type(hidden) is not int or not 0 < hidden < HIDDEN_LIMIT:
        out.append(f"model.hidden_size is {_short(hidden)}, not a positive int")
    if m.get("storage_dtype") not in STORAGE_NAMES:
        out.append(
            f"storage_dtype is {_short(m.get('storage_dtype'))}; expected one of "
            f"{list(STORAGE_NAMES)}"
        )
    final = m.get("final", [])
    if not (
        isinstance(final, list)
        and all(isinstance(k, str) and k in FINAL_KINDS for k in final)
        and len(set(final)) == len(final)
    ):
        out.append(f"final is {_short(final)}, not a list of distinct {list(FINAL_KINDS)}")
    if m.get("engine", "sglang") not in ENGINES:
        out.append(f"engine is {_short(m.get('engine'))}, not one of {list(ENGINES)}")
    planned = m.get("planned")
    if planned is not None and not (type(planned) is int and planned >= 0):
        out.append(f"planned is {_short(planned)}, not a sample count")
    return out


def check_manifest(where, m: Any) -> None:
    """Raise ValueError naming the first problem of manifest object `m` (of `where`)."""
    bad = problems(m)
    if bad:
        raise Refusal(
            f"{where}: manifest.json's {bad[0]}; run `hsdump verify` on the dataset for every "
            "problem"
        )


def planned_of(m: Dict[str, Any]) -> Optional[int]:
    """How many samples the run meant to write (all jobs'): `planned`, or for a manifest
    written before it was recorded, `tokenized.samples` (the same count); None if unknown."""
    tokenized = m.get("tokenized")
    for v in (m.get("planned"), tokenized.get("samples") if isinstance(tokenized, dict) else None):
        if type(v) is int and v >= 0:
            return v
    return None


# ------------------------------------------------------------------------ completeness
@dataclass(frozen=True)
class Progress:
    """How far a dataset is: `done` samples written or refused by the writer (committed, plus
    the writer's skipped records) of the `planned` ones (None: unknown)."""

    committed: int
    refused: int
    planned: Optional[int]

    @property
    def done(self) -> int:
        return self.committed + self.refused

    @property
    def complete(self) -> Optional[bool]:
        """True when every planned sample is committed or refused; None when unknown."""
        return None if self.planned is None else self.done >= self.planned

    @property
    def partial(self) -> bool:
        return self.complete is False

    def line(self) -> str:
        """'N of M samples (partial: ...)' for a partial dataset, else ''."""
        if not self.partial:
            return ""
        return (
            f"partial: {self.committed:,} of {self.planned:,} samples committed"
            + (f" ({self.refused:,} refused)" if self.refused else "")
            + f", {self.planned - self.done:,} not written yet; resume with the same command"
        )

    def to_dict(self) -> Dict[str, Any]:
        return {
            "committed": self.committed,
            "refused": self.refused,
            "planned": self.planned,
            "complete": self.complete,
        }


def progress(m: Dict[str, Any], committed: int, refused: int) -> Progress:
    """The Progress of a dataset whose manifest object is `m`, from its commit records'
    committed and refused (skipped-record) sample counts."""
    return Progress(committed, refused, planned_of(m))
