def pytest_configure(config):
    config.addinivalue_line("markers", "zoo: the zoo's scenarios (user-written training steps, default options)")
    config.addinivalue_line("markers", "zoo_service: a user-written service beside two zoo training jobs")
