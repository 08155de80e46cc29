"""`tfps bench`: side-by-side throughput of the stock PS patterns and tfps."""
