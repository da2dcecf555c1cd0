"""Test-support code that installs itself into the package from outside (fault injection)."""
