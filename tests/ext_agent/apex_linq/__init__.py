"""An example apex_dask agent from another package: linear n-step double Q-learning."""
