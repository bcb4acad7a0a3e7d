"""Percentiles of the Azure LLM inference conversation trace's context lengths, for offline sampling.

``AZURE_CONV_CONTEXT_PERCENTILES[i]`` is the i-th percentile (i = 0..100, numpy's default linear method,
rounded to 0.1 token) of ``ContextTokens`` over the 19,366 requests of ``AzureLLMInferenceTrace_conv.csv``
(Azure public dataset, 2023, CC-BY 4.0; https://github.com/Azure/AzurePublicDataset). It is a 101-number
summary, not a copy of the trace, so :mod:`stepsim.trace_io.synthetic` can draw realistic KV lengths when the
CSV is not available. Regenerate with::

    kv = read_trace(".../AzureLLMInferenceTrace_conv.csv").column("context_tokens").to_numpy()
    np.round(np.quantile(kv, np.linspace(0, 1, 101)), 1)
"""

#: percentiles 0, 1, ..., 100 of the conversation trace's context lengths (tokens)
# fmt: off
AZURE_CONV_CONTEXT_PERCENTILES = (
    2.0, 29.0, 91.0, 161.0, 181.0, 181.0, 191.0, 197.0, 201.0, 203.0,
    207.0, 212.0, 222.0, 242.0, 317.0, 372.0, 375.0, 378.0, 381.0, 384.0,
    387.0, 390.0, 392.0, 394.0, 395.0, 396.0, 398.0, 399.0, 400.0, 402.0,
    403.0, 405.0, 406.0, 408.0, 411.0, 414.0, 419.0, 424.0, 433.0, 456.0,
    703.0, 862.7, 903.0, 946.0, 971.6, 984.0, 994.0, 1002.0, 1009.0, 1014.0,
    1020.0, 1025.0, 1031.0, 1036.0, 1041.0, 1045.0, 1050.0, 1055.0, 1060.0, 1065.0,
    1071.0, 1076.0, 1081.0, 1086.0, 1092.0, 1097.0, 1102.0, 1109.0, 1116.0, 1122.0,
    1130.0, 1139.0, 1147.0, 1159.4, 1171.0, 1189.0, 1214.4, 1249.0, 1311.0, 1314.0,
    1315.0, 1321.0, 1368.3, 1508.0, 1689.2, 1876.2, 2032.0, 2221.0, 2401.2, 2584.0,
    2734.5, 3291.2, 4073.0, 4076.0, 4079.0, 4083.0, 4086.0, 4090.0, 4098.0, 4142.0,
    14050.0,
)
# fmt: on
