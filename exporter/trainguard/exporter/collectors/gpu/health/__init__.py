"""GPU health as NVML reports it: clock event reasons, PCIe link, ECC, remapped rows, NVLink.

Modules: ``gpus`` (the health of every GPU, kept between scrapes), ``device`` (one GPU's reads
and their sample lines), ``fields`` (the slow reads in one ``nvmlDeviceGetFieldValues`` call),
``nvml`` (NVML's health functions and enums), ``lines`` (one scrape's lines and their slots).
"""
