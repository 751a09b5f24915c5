"""`bnfix doctor`: BN monitors record what a training run does to each BatchNorm layer
(`record`, the torch/Keras/TF1 monitors), the BN3xx diagnoses judge it (`diagnose`), and the
command runs a training under the monitors and reports (`command`, `report`, `html`)."""
