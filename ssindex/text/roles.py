"""A file's role by its path: test code or the code under test.

Builds mark every chunk (``is_test`` in the search files) and searches filter on the
mark (``--tests``) and rank by it (``ssindex.query.ranking``), so both read this one
rule. Only the path is read: a file's content says too little (a test helper imports
nothing of pytest, a fixture holds no assertion).
"""

from __future__ import annotations

import re

TEST_DIRS = frozenset({"test", "tests", "__tests__", "__test__", "spec", "specs", "testing",
                       "testdata", "test_data", "fixtures", "e2e", "androidtest"})
"""Directories that hold tests by a language's convention (``src/test/java`` of Maven and
Gradle, ``__tests__`` of Jest, ``spec`` of RSpec, ``tests`` of Cargo and pytest)."""
_TEST_DIR_SUFFIX = ("_test", "_tests")
"""A directory named for what it tests (``idle_test``, ``unit_tests``)."""
_TEST_NAME = re.compile(
    r"^test_|^tests?\.py$|^conftest\.py$"  # pytest, Django
    r"|_test\.|\.test\.|\.spec\.|_spec\.|-test\.|-spec\."  # Go, Jest, Vitest, RSpec, Elixir
    r"|[a-z0-9]Tests?\.[a-z]+$|[a-z0-9]Spec\.[a-z]+$|[a-z0-9]IT\.java$"  # JUnit, xUnit, ScalaTest
)
"""A file name that is a test's by a language's convention."""


def is_test(path: str) -> bool:
    """Whether the file at ``path`` (POSIX, relative to the indexed root) is test code.
    String operations only: a build runs this for every file."""
    directories, _, name = path.rpartition("/")
    if _TEST_NAME.search(name):
        return True
    return any(part.lower() in TEST_DIRS or part.lower().endswith(_TEST_DIR_SUFFIX)
               for part in directories.split("/") if part)
