"""Session simulator: the cost model replayed turn by turn under Ostinato and its baselines."""
