from scipy import Missing

betabinom = Missing("scipy.stats.betabinom")


def __getattr__(name):
    return Missing(f"scipy.stats.{name}")
