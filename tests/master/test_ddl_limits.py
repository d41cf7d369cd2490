"""Bounds on what one DDL request may ask for, checked before any of it is decoded or applied."""

from __future__ import annotations

import pytest

from service.common.errors import InvalidArgument
from service.common.schema import MAX_COLUMNS, AddColumn, ColumnType, DropColumn
from service.master.ddl_checks import MAX_ALTER_STEPS, check_alter_steps


def test_alter_steps_are_capped_at_the_column_limit() -> None:
    assert MAX_ALTER_STEPS == MAX_COLUMNS
    ok = [AddColumn(f"c{i}", ColumnType.INT32) for i in range(MAX_ALTER_STEPS)]
    assert len(check_alter_steps(ok)) == MAX_ALTER_STEPS
    with pytest.raises(InvalidArgument, match=r"301 alter steps in one request; at most 300"):
        check_alter_steps([*ok, DropColumn("c0")])
    with pytest.raises(InvalidArgument, match="unknown alter step"):
        check_alter_steps(["drop everything"])
