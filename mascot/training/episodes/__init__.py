"""Episodes: rollouts of the graph with a simulated person, import from checkpointer databases, traces."""
