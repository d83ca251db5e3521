"""Scaffolding the tests share (paths, a role runner); nothing here is a test or a conftest."""
