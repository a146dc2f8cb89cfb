"""RLLaVA's module paths that its example reward files import (`rllava.model.modules.rm.*`), kept so those files
run here unchanged."""
