"""Train while capturing: hsdump publishes each committed sample to SpecForge 0.2.0's online
consumer through one shared folder, with the disk held under a cap (docs/online.md).

- `folder`: the folder's layout, the ref lines and the side files both sides read (no torch,
  no SpecForge): the contract.
- `producer`: the capture side (hsdump's pipeline, epoch after epoch, with a disk gate awaited
  in the engine's request loop and a publisher tailing the commit logs).
- `store`: the trainer side's FeatureStore (SpecForge's interface): reads hsdump's shards and
  deletes a shard once the trainer has acknowledged all its samples.
- `consumer`: `python -m hsdump.online.consumer FOLDER -c run.yaml`, SpecForge's own online
  consumer on the folder.
"""
