"""Column types and DDL elements the schema declares with, compiled per dialect."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Column, Table, Text
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateColumn, ExecutableDDLElement
from sqlalchemy.sql.compiler import DDLCompiler, GenericTypeCompiler

__all__ = ["AddColumn", "BytewiseText", "FillReceiptApprovals"]


class BytewiseText(Text):
    """Text that compares byte by byte on every dialect, so identifiers never fold and ISO
    timestamps sort like the times they spell.

    Postgres DDL declares it ``TEXT COLLATE "C"``; SQLite's ``TEXT`` already compares bytewise.
    Only the DDL says so: bound parameters stay plain text, as for any ``Text`` column.
    """


@compiles(BytewiseText, "postgresql")
def _bytewise_postgresql(type_: BytewiseText, compiler: GenericTypeCompiler, **kw: Any) -> str:
    return 'TEXT COLLATE "C"'


@compiles(BytewiseText)
def _bytewise_default(type_: BytewiseText, compiler: GenericTypeCompiler, **kw: Any) -> str:
    return compiler.visit_TEXT(type_, **kw)


class AddColumn(ExecutableDDLElement):
    """``ALTER TABLE <table> ADD COLUMN <the column as the MetaData declares it>``."""

    inherit_cache = False

    def __init__(self, column: Column[Any]) -> None:
        self.column = column


@compiles(AddColumn)
def _add_column(element: AddColumn, compiler: DDLCompiler, **kw: Any) -> str:
    table = compiler.preparer.format_table(element.column.table)
    return f"ALTER TABLE {table} ADD COLUMN {compiler.process(CreateColumn(element.column), **kw)}"


class FillReceiptApprovals(ExecutableDDLElement):
    """Copy each stored receipt document's ``approval_id`` into its column, for rows written
    before the column existed; a row whose text is not JSON is left ``NULL``."""

    inherit_cache = False

    def __init__(self, receipts: Table) -> None:
        self.receipts = receipts


_PG_FILL = """DO $fill$
DECLARE r record;
BEGIN
  BEGIN
    UPDATE {t} SET approval_id = json::jsonb ->> 'approval_id'
    WHERE approval_id IS NULL AND position('"approval_id":"' in json) > 0;
  EXCEPTION WHEN others THEN  -- a row that is not JSON: fill the others one by one
    FOR r IN SELECT receipt_id, json FROM {t}
             WHERE approval_id IS NULL AND position('"approval_id":"' in json) > 0 LOOP
      BEGIN
        UPDATE {t} SET approval_id = r.json::jsonb ->> 'approval_id'
        WHERE receipt_id = r.receipt_id;
      EXCEPTION WHEN others THEN NULL;
      END;
    END LOOP;
  END;
END $fill$"""


@compiles(FillReceiptApprovals, "postgresql")
def _fill_postgresql(element: FillReceiptApprovals, compiler: DDLCompiler, **kw: Any) -> str:
    return _PG_FILL.replace("{t}", compiler.preparer.format_table(element.receipts))


@compiles(FillReceiptApprovals)
def _fill_default(element: FillReceiptApprovals, compiler: DDLCompiler, **kw: Any) -> str:
    table = compiler.preparer.format_table(element.receipts)
    return (
        f"UPDATE {table} SET approval_id = CASE WHEN json_valid(json) THEN CASE WHEN "
        "json_type(json, '$.approval_id') = 'text' THEN json_extract(json, '$.approval_id') "
        "END END WHERE approval_id IS NULL AND instr(json, '\"approval_id\":\"') > 0"
    )
