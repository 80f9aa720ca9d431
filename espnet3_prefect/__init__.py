"""espnet3-prefect."""
