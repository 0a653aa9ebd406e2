"""What the kernel families' recordings share (:mod:`.common`: zeroing, gathers of cache rows,
the fixed-order reductions, the d_s scatter, the carry over time chunks). Each family records
in its own folder (``ssm_vk/<family>/record.py``); ssm_vk.families picks the one a plan names."""
