"""What only watches the engine: step records and observers (``observers``), snapshots for the
page (``snapshot``), memory accounting (``accounting``) and the contiguous baselines run on the
same requests (``baselines``). Nothing here changes engine state."""
