const tabs = [];
const setups = [];
export const app = {
  extensions: [],
  extensionManager: { tabs, registerSidebarTab(tab) { tabs.push(tab); } },
  registerExtension(ext) {
    this.extensions.push(ext);
    setups.push(Promise.resolve(ext.setup ? ext.setup(this) : undefined));
  },
  get ready() { return Promise.all(setups); },
};
