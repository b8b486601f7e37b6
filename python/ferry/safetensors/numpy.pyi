import os
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple, Union

import ferry

from . import SafetensorError as SafetensorError

StrPath = Union[str, os.PathLike]

def load_file(
    filename: StrPath,
    *,
    keys: Optional[Iterable[str]] = None,
    slices: Optional[Mapping[str, Tuple[int, Optional[int], Optional[int]]]] = None,
    verify: bool = False,
    staging_budget: Optional[int] = None,
    context: Optional[ferry.Context] = None,
) -> Dict[str, Any]: ...
def save_file(
    tensor_dict: Dict[str, Any],
    filename: StrPath,
    metadata: Optional[Dict[str, str]] = None,
    *,
    checksum: bool = False,
    durable: bool = True,
    context: Optional[ferry.Context] = None,
) -> None: ...
