"""RLLaVA's module paths its example reward files import (`rllava.model.modules.rm.*`), so they run here unchanged."""
