const tabs = [];
const setups = [];
export const app = {
  extensions: [],
  // the frontend's toast store: what was added, in order
  extensionManager: { tabs, registerSidebarTab(tab) { tabs.push(tab); }, toast: { added: [], add(m) { this.added.push(m); } } },
  registerExtension(ext) {
    this.extensions.push(ext);
    setups.push(Promise.resolve(ext.setup ? ext.setup(this) : undefined));
  },
  get ready() { return Promise.all(setups); },
};
