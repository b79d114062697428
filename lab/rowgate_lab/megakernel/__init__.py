"""Host side of the persistent decode megakernel: task ABI v1 packing (`abi`), what
each opcode touches (`operands`), the validator (`validate`), the decode-step task-list
builder (`builder`) and the fallback route (`fallback`). docs/task-abi.md specifies it."""
