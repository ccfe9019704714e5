# esmshard's documented entry point. The workflow is workflow/Snakefile, where the Snakemake
# workflow catalog looks for it; it is included with its default target (rule all), which a
# plain `include:` directive would leave behind.
workflow.include("workflow/Snakefile", overwrite_default_target=True)
