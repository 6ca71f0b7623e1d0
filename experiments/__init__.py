"""One module per paper figure (`experiments/<id>.py`), each with `compute(ctx)` writing tidy
CSVs and `plot(ctx)` drawing PNGs from those CSVs. Run them with `ppsim reproduce`."""

EXPERIMENT_IDS = ("fig1", "fig3", "fig4", "fig9", "fig10", "fig11", "fig12", "fig13", "fig14", "table1", "busbw",
                  "disagg_distserve", "disagg_vllm")
