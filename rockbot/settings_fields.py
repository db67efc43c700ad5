"""Field types the processes' settings share: how a value reads from its `ROCKBOT_*` variable."""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator
from pydantic_settings import NoDecode


def split_commas(value: object) -> object:
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


#: A list of strings that a variable gives as comma-separated text (`a, b`), not as JSON; a list stays a list.
CommaSeparated = Annotated[list[str], NoDecode, BeforeValidator(split_commas)]
