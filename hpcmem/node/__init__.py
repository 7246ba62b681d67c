"""The node and its memory: NUMA and HBW nodes (``topology``), the numactl binding we plan
for a rank (``planned``), the binding a process actually has (``applied``) and what else the
node offers (``probe``); CPU and node lists checked against what exists (``idlist``) and the
rank a launcher announces (``launcher``)."""
