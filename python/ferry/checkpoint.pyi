"""Type stubs for ferry.checkpoint (docs/CHECKPOINTS.md, "Python")."""
import os
from typing import Any, Dict, Iterable, Literal, Mapping, Optional, Tuple, Union

import ferry

StrPath = Union[str, os.PathLike]
Device = Union[str, int, Any]
TREE_KEY: str
Replicated = Union[bool, Literal["auto"], str, Iterable[str]]

def flatten(state: Any) -> Tuple[Dict[str, Any], Optional[dict]]: ...
def unflatten(flat: Dict[str, Any], tree: Optional[dict]) -> Any: ...

class SaveHandle:
    step: int
    def done(self) -> bool: ...
    def wait(self, timeout: Optional[float] = None) -> bool: ...
    def result(self, timeout: Optional[float] = None) -> int: ...
    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]: ...
    def phases(self) -> Dict[str, float]: ...

def prepare(
    state: Any,
    directory: StrPath,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    *,
    run: Optional[str] = None,
    background: bool = False,
    replicated: Replicated = "auto",
    context: Optional[ferry.Context] = None,
) -> int: ...

def save(
    state: Any,
    directory: StrPath,
    step: int,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    keep: Optional[int] = None,
    metadata: Optional[Dict[str, str]] = None,
    *,
    checksum: Optional[bool] = None,
    busy: Literal["wait", "refuse"] = "wait",
    run: Optional[str] = None,
    timeout: Optional[float] = None,
    recycle: Optional[bool] = None,
    replicated: Replicated = "auto",
    compress: Union[None, bool, Literal["off", "zstd", "lz4", "auto"]] = None,
    context: Optional[ferry.Context] = None,
    progress: Any = None,
) -> None: ...
def async_save(
    state: Any,
    directory: StrPath,
    step: int,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    keep: Optional[int] = None,
    metadata: Optional[Dict[str, str]] = None,
    *,
    checksum: Optional[bool] = None,
    busy: Literal["wait", "refuse"] = "wait",
    run: Optional[str] = None,
    timeout: Optional[float] = None,
    recycle: Optional[bool] = None,
    replicated: Replicated = "auto",
    compress: Union[None, bool, Literal["off", "zstd", "lz4", "auto"]] = None,
    context: Optional[ferry.Context] = None,
    progress: Any = None,
) -> SaveHandle: ...
def latest_step(directory: StrPath, *, missing_ok: bool = False) -> Optional[int]: ...
def load(
    directory: StrPath,
    step: int,
    device: Device = "cpu",
    *,
    rank: Union[int, Literal["all"], None] = None,
    world_size: Optional[int] = None,
    shard_dims: Optional[Mapping[str, int]] = None,
    verify: Optional[bool] = None,
    views: bool = True,
    nested: bool = True,
    context: Optional[ferry.Context] = None,
) -> Any: ...
def load_latest(
    directory: StrPath,
    device: Device = "cpu",
    *,
    rank: Union[int, Literal["all"], None] = None,
    world_size: Optional[int] = None,
    shard_dims: Optional[Mapping[str, int]] = None,
    verify: Optional[bool] = None,
    views: bool = True,
    nested: bool = True,
    missing_ok: bool = False,
    context: Optional[ferry.Context] = None,
) -> Tuple[Optional[int], Any]: ...
def verify(directory: StrPath, step: Optional[int] = None, *, require_checksums: bool = False,
           context: Optional[ferry.Context] = None) -> int: ...
def prune(directory: StrPath, keep: int) -> int: ...
