"""A user's project in miniature: training steps nobody tuned (models.py) and their scenarios (test_zoo.py)."""
