"""What makes a new coordinator train within seconds: stored traces, cached graphs, warm-up."""
