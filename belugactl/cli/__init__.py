"""Typer commands: parse, call a workflow, render. No decisions live here."""
