"""The sless API: REST resources, invoke proxy, console, and the backends behind them."""
