"""Repository-level pytest configuration: the plugin's own tests drive real pytest runs."""

pytest_plugins = ["pytester"]
