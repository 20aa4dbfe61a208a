"""Figure builders: pure functions from snapshot(s) to a Plotly figure (one module per view)."""
