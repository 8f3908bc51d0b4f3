# pytester drives real pytest runs of the plugin in the integration tests.
pytest_plugins = ["pytester"]
