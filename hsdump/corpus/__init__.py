"""Stage 1: rows from a source to (input_ids, loss_mask) samples: sources, row formats, chat templates, masks, the tokenizer, regeneration."""
